//! The batch decoder of messages stored as body + headers JSON.

use std::fmt;

use super::MessageRegistry;
use super::decode::unreadable_headers;
use super::decode::{HeaderSink, Prepared};
use crate::Envelope;

/// Decodes a run of messages stored as body + headers JSON (see
/// [`MessageRegistry::decode_json`]), remembering the last headers text: messages that carry the
/// same headers (the common case: one type, no stamps yet) skip parsing them and looking the
/// type up again. Build one per batch with [`MessageRegistry::json_decoder`].
///
/// ```
/// # use courier_core::{Message, MessageRegistry};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
/// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
/// let registry = MessageRegistry::new().with::<Ping>();
/// let mut decoder = registry.json_decoder();
/// let headers = r#"{"type":"app.ping"}"#;
/// let a = decoder.decode(r#"{"n":1}"#.to_owned(), headers);
/// let b = decoder.decode(r#"{"n":2}"#.to_owned(), headers);
/// assert_eq!(a.message::<Ping>().map(|p| p.n), Some(1));
/// assert_eq!(b.message::<Ping>().map(|p| p.n), Some(2));
/// assert!(decoder.decode("{}".to_owned(), "not json").decode_error().is_some());
/// ```
pub struct JsonDecoder<'r> {
    pub(super) registry: &'r MessageRegistry,
    pub(super) last: Option<(String, Prepared)>,
    /// Whether a message was decoded already: the first one is not remembered, so a batch of
    /// one costs no more than [`MessageRegistry::decode_json`].
    pub(super) warm: bool,
}

impl fmt::Debug for JsonDecoder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonDecoder")
            .field("registry", self.registry)
            .finish_non_exhaustive()
    }
}

impl JsonDecoder<'_> {
    /// Decodes one message stored as bytes: a body that may not be UTF-8 and headers that may
    /// be missing (`None`, read as no headers) or not text. Never fails, and never fails on the
    /// bytes: what does not decode is an envelope whose [`Envelope::decode_error`] says why and
    /// that keeps the bytes, so it can go to the failure transport as it was stored.
    #[must_use]
    pub fn decode_bytes(&mut self, body: Vec<u8>, headers: Option<&[u8]>) -> Envelope {
        let headers = headers.unwrap_or(b"{}");
        let text = match std::str::from_utf8(headers) {
            Ok(text) => text,
            Err(e) => {
                let source = <serde_json::Error as serde::de::Error>::custom(format_args!(
                    "headers are not UTF-8 text ({e})"
                ));
                return unreadable_headers(body, headers, source);
            }
        };
        match String::from_utf8(body) {
            Ok(body) => self.decode(body, text),
            Err(e) => match serde_json::from_str::<HeaderSink<'_>>(text) {
                Ok(sink) => sink.finish_not_text(&self.registry.decoders, e),
                Err(source) => unreadable_headers(e.into_bytes(), headers, source),
            },
        }
    }

    /// Decodes one message, exactly as [`MessageRegistry::decode_json`] does.
    #[must_use]
    pub fn decode(&mut self, body: String, headers: &str) -> Envelope {
        if let Some((text, prepared)) = &self.last
            && text == headers
        {
            return prepared.envelope(body);
        }
        if !std::mem::replace(&mut self.warm, true) {
            return self.registry.decode_json(body, headers);
        }
        match serde_json::from_str::<HeaderSink<'_>>(headers) {
            Ok(sink) => match sink.prepare(&self.registry.decoders) {
                Ok(prepared) => {
                    let envelope = prepared.envelope(body);
                    self.last = Some((headers.to_owned(), prepared));
                    envelope
                }
                Err(rejected) => rejected.envelope(body.into_bytes()),
            },
            Err(source) => unreadable_headers(body.into_bytes(), headers.as_bytes(), source),
        }
    }
}

impl MessageRegistry {
    /// A decoder for a batch of messages in the [`decode_json`](MessageRegistry::decode_json) form, which
    /// parses each distinct headers text once.
    #[must_use]
    pub fn json_decoder(&self) -> JsonDecoder<'_> {
        JsonDecoder {
            registry: self,
            last: None,
            warm: false,
        }
    }
}
