//! The byte string a signature covers (see the [module docs](super)).

use std::fmt::Write as _;

use crate::codec::{STAMP_HEADER_PREFIX, TYPE_HEADER, encode};
use crate::{EncodeError, Envelope, Stamp};

/// Stamp kinds a signature does not cover: the signature itself and the delivery bookkeeping a
/// worker rewrites when it retries a message or moves it to the failure transport.
pub const UNSIGNED_STAMPS: [&str; 6] = [
    super::SignatureStamp::NAME,
    crate::DelayStamp::NAME,
    crate::RedeliveryStamp::NAME,
    crate::ErrorDetailsStamp::NAME,
    crate::HandledStamp::NAME,
    crate::SentToFailureTransportStamp::NAME,
];

/// The byte string the signature of `envelope` covers (version 1). For a received envelope,
/// only the stamps it was received with count: those before its first
/// [`ReceivedStamp`](crate::ReceivedStamp), not those a worker hook added since.
///
/// # Errors
/// [`EncodeError`] when the message does not serialize.
pub fn signing_input(envelope: &Envelope) -> Result<Vec<u8>, EncodeError> {
    let received_at = envelope
        .stamp_names()
        .position(|n| n == crate::ReceivedStamp::NAME);
    let wire = match received_at {
        Some(at) => {
            let mut as_received = envelope.clone();
            as_received.stamps.truncate(at);
            encode(&as_received)?
        }
        None => encode(envelope)?,
    };
    let mut out = Vec::with_capacity(wire.body.len() + 256);
    netstring(&mut out, b"courier-signature-v1");
    netstring(
        &mut out,
        wire.headers
            .get(TYPE_HEADER)
            .map_or(&b""[..], |t| t.as_bytes()),
    );
    netstring(&mut out, wire.body.as_bytes());
    // BTreeMap: sorted by header name.
    for (name, value) in &wire.headers {
        let Some(stamp) = name.strip_prefix(STAMP_HEADER_PREFIX) else {
            continue;
        };
        if UNSIGNED_STAMPS.contains(&stamp) {
            continue;
        }
        netstring(&mut out, name.as_bytes());
        netstring(&mut out, value.as_bytes());
    }
    Ok(out)
}

fn netstring(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut len = String::new();
    let _ = write!(len, "{}:", bytes.len());
    out.extend_from_slice(len.as_bytes());
    out.extend_from_slice(bytes);
    out.push(b',');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BusNameStamp, Message, RedeliveryStamp};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ping {
        n: u8,
    }
    impl Message for Ping {
        const NAME: &'static str = "app.ping";
    }

    #[test]
    fn stamps_added_after_receipt_are_not_covered() {
        let sent = Envelope::new(Ping { n: 1 }).with(BusNameStamp("default".into()));
        let received = sent
            .clone()
            .with(crate::ReceivedStamp("async".into()))
            .with(crate::PriorityStamp(3));
        assert_eq!(
            signing_input(&sent).unwrap_or_default(),
            signing_input(&received).unwrap_or_default()
        );
    }

    #[test]
    fn the_input_is_type_body_and_signed_stamps_as_netstrings() {
        let env = Envelope::new(Ping { n: 7 })
            .with(BusNameStamp("default".into()))
            .with(RedeliveryStamp::new(1));
        let input = signing_input(&env).unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&input),
            "20:courier-signature-v1,8:app.ping,7:{\"n\":7},\
             24:x-courier-stamp-bus-name,11:[\"default\"],"
        );
    }
}
