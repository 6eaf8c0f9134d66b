//! The NATS form of Courier's wire format: the body as the message payload and every Courier
//! header (`type`, `content-type`, `x-courier-stamp-*`, extra headers) as a NATS header of the
//! same name. Plus the transport's own headers, and the JetStream ack subject's fields.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use courier_core::Encoded;

/// The transport's delay header: the delay in milliseconds, counted from the moment the server
/// stored the message. Dropped on receive.
pub(crate) const DELAY_HEADER: &str = "Courier-Delay";

/// JetStream's deduplication header.
pub(crate) const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Headers NATS or the transport own (`Nats-*`, [`DELAY_HEADER`]): dropped on receive so they
/// do not travel on with a relayed or retried message.
fn is_transport_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(DELAY_HEADER)
        || name
            .get(..5)
            .is_some_and(|p| p.eq_ignore_ascii_case("nats-"))
}

/// Builds the NATS headers of one publish: each Courier header as it is, the delay header when
/// delayed, `Nats-Msg-Id` when the envelope has a message id.
///
/// NATS headers are lines of text: a value with a line break would end the header, and
/// surrounding whitespace is trimmed on receive. Such a value (never one Courier writes: stamps
/// are JSON) is refused, naming the header, rather than changed in transit.
pub(crate) fn headers(
    encoded: &Encoded,
    delay: Option<Duration>,
    msg_id: Option<String>,
) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in &encoded.headers {
        if is_transport_header(name) {
            continue;
        }
        let header = async_nats::HeaderName::try_from(name.as_str()).map_err(|e| {
            format!(
                "header name `{}` is not a valid NATS header name: {e}",
                name.escape_debug()
            )
        })?;
        if value.contains(['\r', '\n']) || value.trim() != value {
            return Err(format!(
                "the value of header `{name}` has a line break or surrounding whitespace, which \
                 NATS headers cannot carry"
            ));
        }
        map.insert(header, value.as_str());
    }
    if let Some(delay) = delay.filter(|d| !d.is_zero()) {
        map.insert(DELAY_HEADER, delay_millis(delay).to_string());
    }
    if let Some(id) = msg_id {
        map.insert(MSG_ID_HEADER, id);
    }
    Ok(map)
}

/// The headers of a stored message published again by the transport (a delayed message moved
/// to the delay subject, or promoted from it when due): every header as it came, each value
/// kept, without the transport's own (`Nats-*`, [`DELAY_HEADER`]); then `delay` as the delay
/// header when there is one, and `msg_id` as `Nats-Msg-Id`, so publishing it again after a
/// crash is stored once.
pub(crate) fn forwarded(
    map: Option<&HeaderMap>,
    delay: Option<Duration>,
    msg_id: String,
) -> HeaderMap {
    let mut out = HeaderMap::new();
    if let Some(map) = map {
        for (name, values) in map.iter() {
            if is_transport_header(name.as_ref()) {
                continue;
            }
            for value in values {
                out.append(name.clone(), value.clone());
            }
        }
    }
    if let Some(delay) = delay.filter(|d| !d.is_zero()) {
        out.insert(DELAY_HEADER, delay_millis(delay).to_string());
    }
    out.insert(MSG_ID_HEADER, msg_id);
    out
}

/// A delay in whole milliseconds, rounded up (never early).
pub(crate) fn delay_millis(delay: Duration) -> u64 {
    let ms = delay.as_millis();
    let ms = if Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)) < delay {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// Reads received NATS headers back into wire form (the first value of each name), without the
/// transport's own headers; returns them with the delay header's value.
pub(crate) fn incoming(map: Option<&HeaderMap>) -> (BTreeMap<String, String>, Option<Duration>) {
    let mut headers = BTreeMap::new();
    let mut delay = None;
    let Some(map) = map else {
        return (headers, delay);
    };
    for (name, values) in map.iter() {
        let name: &str = name.as_ref();
        let Some(value) = values.first() else {
            continue;
        };
        if name.eq_ignore_ascii_case(DELAY_HEADER) {
            delay = value
                .as_str()
                .parse::<u64>()
                .ok()
                .map(Duration::from_millis);
        } else if !is_transport_header(name) {
            headers.insert(name.to_owned(), value.as_str().to_owned());
        }
    }
    (headers, delay)
}

/// The `Nats-Msg-Id` of an envelope with a message id: the id and a digest of what is sent, so
/// the same stored envelope relayed twice is deduplicated by the stream, while a retry of it
/// (new stamps) is a new message.
pub(crate) fn msg_id(message_id: &str, encoded: &Encoded) -> String {
    let mut hash = Fnv::new();
    for (name, value) in &encoded.headers {
        hash.write(name.as_bytes());
        hash.write(&[0]);
        hash.write(value.as_bytes());
        hash.write(&[0]);
    }
    hash.write(encoded.body.as_bytes());
    format!("{message_id}:{:016x}", hash.0)
}

/// FNV-1a, 64 bits: stable across processes and Rust versions (unlike `DefaultHasher`).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The fields of a JetStream ack subject (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream
/// seq>.<consumer seq>.<timestamp>.<pending>`, with `<domain>.<account hash>.` before the
/// stream and a token after on newer servers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckSubject {
    /// The message's stream sequence: its id.
    pub(crate) stream_seq: u64,
    /// The delivery's consumer sequence: a new one for every delivery.
    pub(crate) consumer_seq: u64,
    /// When the server stored the message, in nanoseconds since the epoch.
    pub(crate) published_nanos: u128,
}

impl AckSubject {
    pub(crate) fn parse(reply: &str) -> Option<Self> {
        let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
        let base = match tokens.len() {
            7 => 0,
            n if n >= 9 => 2,
            _ => return None,
        };
        let field = |i: usize| tokens.get(base + i).and_then(|t| t.parse::<u128>().ok());
        Some(Self {
            stream_seq: u64::try_from(field(3)?).ok()?,
            consumer_seq: u64::try_from(field(4)?).ok()?,
            published_nanos: field(5)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_travel_by_name_and_come_back_without_the_transports_own() {
        let encoded = Encoded::new("{}")
            .header("type", "t.x")
            .header("content-type", "application/json")
            .header("x-courier-stamp-delay", "[1500]")
            .header("x-custom", "ü ✓");
        let map = headers(
            &encoded,
            Some(Duration::from_micros(1_500_001)),
            Some("id:1".into()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            map.get(DELAY_HEADER).map(|v| v.as_str().to_owned()),
            Some("1501".into())
        );
        assert!(map.get(MSG_ID_HEADER).is_some());
        let (back, delay) = incoming(Some(&map));
        assert_eq!(back, encoded.headers);
        assert_eq!(delay, Some(Duration::from_millis(1501)));
    }

    #[test]
    fn forwarded_headers_keep_every_value_and_replace_the_transports_own() {
        let mut map = HeaderMap::new();
        map.insert("type", "t.x");
        map.append("x-many", "1");
        map.append("x-many", "2");
        map.insert(DELAY_HEADER, "5000");
        map.insert(MSG_ID_HEADER, "old");
        map.insert("Nats-Expected-Stream", "s");
        let out = forwarded(Some(&map), Some(Duration::from_millis(1200)), "new".into());
        assert_eq!(
            out.get("type").map(|v| v.as_str().to_owned()),
            Some("t.x".into())
        );
        let many: Vec<String> = out
            .get_all("x-many")
            .map(|v| v.as_str().to_owned())
            .collect();
        assert_eq!(many, ["1", "2"]);
        assert_eq!(
            out.get(DELAY_HEADER).map(|v| v.as_str().to_owned()),
            Some("1200".into())
        );
        assert_eq!(
            out.get(MSG_ID_HEADER).map(|v| v.as_str().to_owned()),
            Some("new".into())
        );
        assert!(out.get("Nats-Expected-Stream").is_none());
        let due = forwarded(Some(&map), None, "id".into());
        assert!(
            due.get(DELAY_HEADER).is_none(),
            "a due message carries no delay"
        );
    }

    #[test]
    fn a_header_value_nats_cannot_carry_is_refused_by_name() {
        for value in ["two\r\nlines", " padded"] {
            let encoded = Encoded::new("{}").header("x-odd", value);
            let e = headers(&encoded, None, None).err().unwrap_or_default();
            assert!(e.contains("`x-odd`"), "{e}");
        }
    }

    #[test]
    fn the_msg_id_changes_with_the_stamps_and_not_otherwise() {
        let a = Encoded::new("{}").header("type", "t");
        let b = Encoded::new("{}")
            .header("type", "t")
            .header("x-courier-stamp-redelivery", "[1]");
        assert_eq!(msg_id("m", &a), msg_id("m", &a.clone()));
        assert_ne!(msg_id("m", &a), msg_id("m", &b));
        assert!(msg_id("m", &a).starts_with("m:"));
    }

    #[test]
    fn ack_subjects_of_old_and_new_servers_parse() {
        let old = AckSubject::parse("$JS.ACK.orders.courier.2.17.40.1796155070093619696.3");
        assert_eq!(
            old,
            Some(AckSubject {
                stream_seq: 17,
                consumer_seq: 40,
                published_nanos: 1_796_155_070_093_619_696
            })
        );
        let new = AckSubject::parse(
            "$JS.ACK.hub.ACCHASH.orders.courier.2.17.40.1796155070093619696.3.tok",
        );
        assert_eq!(new, old);
        assert_eq!(AckSubject::parse("_INBOX.x"), None);
        assert_eq!(AckSubject::parse("$JS.ACK.a.b.c"), None);
    }
}
