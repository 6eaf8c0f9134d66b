//! The [`MessageRegistry`]: wire names to message types, and the entry points of decoding.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::decode::HeaderSink;
use super::decode::unreadable_headers;
use super::{DecodeFn, EncodeError, Encoded, encode};
use crate::{Envelope, Message};

/// Maps wire names to message types, and encodes / decodes envelopes.
#[derive(Clone, Default)]
pub struct MessageRegistry {
    pub(super) decoders: HashMap<&'static str, DecodeFn>,
}

impl fmt::Debug for MessageRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.decoders.keys().collect();
        names.sort();
        f.debug_struct("MessageRegistry")
            .field("messages", &names)
            .finish()
    }
}

impl MessageRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `M` under [`Message::NAME`].
    pub fn register<M: Message>(&mut self) -> &mut Self {
        self.decoders.insert(M::NAME, DecodeFn::of::<M>());
        self
    }

    /// Builder form of [`MessageRegistry::register`].
    #[must_use]
    pub fn with<M: Message>(mut self) -> Self {
        self.register::<M>();
        self
    }

    /// Adds every message of `other`.
    pub fn extend(&mut self, other: &MessageRegistry) {
        self.decoders
            .extend(other.decoders.iter().map(|(k, v)| (*k, *v)));
    }

    /// Whether every message of `other` is registered here too.
    pub(crate) fn covers(&self, other: &MessageRegistry) -> bool {
        other.decoders.keys().all(|k| self.decoders.contains_key(k))
    }

    /// Whether a message is registered under `name`.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.decoders.contains_key(name)
    }

    /// Encodes an envelope: body, `type`, `content-type`, one header per sendable stamp kind, and
    /// the extra headers it was received with. Local stamps are dropped.
    ///
    /// # Errors
    /// [`EncodeError`] if the message does not serialize.
    pub fn encode(&self, envelope: &Envelope) -> Result<Encoded, EncodeError> {
        encode(envelope)
    }

    /// Decodes a wire message. Never fails: a message that does not decode comes back as an
    /// envelope whose [`Envelope::decode_error`] says why, with its body and stamps kept, so the
    /// worker can move it to the failure transport.
    #[must_use]
    pub fn decode(&self, encoded: Encoded) -> Envelope {
        let Encoded { body, headers } = encoded;
        let mut sink = HeaderSink::with_capacity(headers.len());
        for (key, value) in headers {
            sink.push(Cow::Owned(key), Cow::Owned(value));
        }
        sink.finish(&self.decoders, body)
    }

    /// [`Self::decode`] of headers given as pairs, each borrowed or owned, sorted by name with
    /// no name twice (what the header map of [`Encoded`] holds), without building that map: for a
    /// format whose headers are read borrowed from the text they arrive in.
    ///
    /// ```
    /// # use std::borrow::Cow;
    /// # use courier_core::{Message, MessageRegistry};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
    /// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
    /// let registry = MessageRegistry::new().with::<Ping>();
    /// let envelope = registry.decode_pairs(
    ///     r#"{"n":7}"#.to_owned(),
    ///     [(Cow::Borrowed("type"), Cow::Borrowed("app.ping"))],
    /// );
    /// assert_eq!(envelope.message::<Ping>().map(|p| p.n), Some(7));
    /// ```
    #[must_use]
    pub fn decode_pairs<'a>(
        &self,
        body: String,
        headers: impl IntoIterator<Item = (Cow<'a, str>, Cow<'a, str>)>,
    ) -> Envelope {
        let headers = headers.into_iter();
        let mut sink = HeaderSink::with_capacity(headers.size_hint().0);
        for (key, value) in headers {
            sink.push(key, value);
        }
        sink.finish(&self.decoders, body)
    }

    /// Decodes a message stored as a body and its headers as one JSON object (the form
    /// [`encode_json`](crate::encode_json) writes), without building the header map first. Never fails: headers
    /// that are not a JSON object of strings give an envelope whose
    /// [`Envelope::decode_error`] is [`DecodeError::InvalidHeaders`](crate::DecodeError::InvalidHeaders), with its body kept.
    ///
    /// ```
    /// # use courier_core::{Message, MessageRegistry};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
    /// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
    /// let registry = MessageRegistry::new().with::<Ping>();
    /// let envelope = registry.decode_json(r#"{"n":7}"#.to_owned(), r#"{"type":"app.ping"}"#);
    /// assert_eq!(envelope.message::<Ping>().map(|p| p.n), Some(7));
    /// ```
    #[must_use]
    pub fn decode_json(&self, body: String, headers: &str) -> Envelope {
        match serde_json::from_str::<HeaderSink<'_>>(headers) {
            Ok(sink) => sink.finish(&self.decoders, body),
            Err(source) => unreadable_headers(body.into_bytes(), headers.as_bytes(), source),
        }
    }

    /// Decodes a message whose body may not be UTF-8 text (an AMQP body, say). Never fails: a
    /// body that is not UTF-8 gives an envelope whose [`Envelope::decode_error`] is
    /// [`DecodeError::BodyNotText`](crate::DecodeError::BodyNotText), keeping the bytes (see [`Envelope::undecodable_body`]).
    #[must_use]
    pub fn decode_bytes(&self, body: Vec<u8>, headers: BTreeMap<String, String>) -> Envelope {
        match String::from_utf8(body) {
            Ok(body) => self.decode(Encoded { body, headers }),
            Err(e) => {
                let mut sink = HeaderSink::with_capacity(headers.len());
                for (key, value) in headers {
                    sink.push(Cow::Owned(key), Cow::Owned(value));
                }
                sink.finish_not_text(&self.decoders, e)
            }
        }
    }
}
