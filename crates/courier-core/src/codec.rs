//! The language-neutral wire format and the registry that maps wire names to message types.
//!
//! A message on the wire is a **body** (the message as JSON) and **headers** (string -> string):
//!
//! | header | value |
//! |---|---|
//! | `type` | the wire name, e.g. `app.send_invoice` |
//! | `content-type` | `application/json` |
//! | `x-courier-stamp-<name>` | a JSON list of the sendable stamps of that kind, oldest first |
//!
//! Any other header is kept verbatim. A producer in another language enqueues a message by
//! writing that body and the `type` header:
//!
//! ```
//! use courier_core::{Encoded, Message, MessageRegistry, RedeliveryStamp};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendInvoice { invoice_id: u64 }
//! impl Message for SendInvoice { const NAME: &'static str = "billing.send_invoice"; }
//!
//! let registry = MessageRegistry::new().with::<SendInvoice>();
//! let wire = Encoded::new(r#"{"invoice_id": 42}"#)
//!     .header("type", "billing.send_invoice")
//!     .header("x-courier-stamp-redelivery", r#"[{"retry_count":1,"at":1700000000000}]"#);
//! let envelope = registry.decode(wire);
//! assert_eq!(envelope.message::<SendInvoice>().map(|m| m.invoice_id), Some(42));
//! assert_eq!(envelope.last::<RedeliveryStamp>().map(|s| s.retry_count), Some(1));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::Message;
use crate::envelope::{RawSlot, Slot};
use crate::message::{AnyMessage, Payload};

/// The `type` header.
pub const TYPE_HEADER: &str = "type";
/// The `content-type` header.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// The only content type Courier writes.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// The prefix of stamp headers.
pub const STAMP_HEADER_PREFIX: &str = "x-courier-stamp-";

/// A message in its wire form: body and headers.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Encoded {
    /// The message as JSON text.
    pub body: String,
    /// `type`, `content-type`, one `x-courier-stamp-<name>` per stamp kind, and any extra headers.
    pub headers: BTreeMap<String, String>,
}

impl Encoded {
    /// A wire message with this body and no headers yet.
    #[must_use]
    pub fn new(body: impl Into<String>) -> Self {
        Self {
            body: body.into(),
            headers: BTreeMap::new(),
        }
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The headers as one JSON object (the SQL `headers` column and the Redis `headers` field).
    #[must_use]
    pub fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Parses headers stored as one JSON object of string -> string.
    ///
    /// # Errors
    /// [`DecodeError::InvalidHeaders`] if the text is not such an object.
    pub fn parse_headers(json: &str) -> Result<BTreeMap<String, String>, DecodeError> {
        serde_json::from_str(json).map_err(|e| DecodeError::InvalidHeaders { source: e })
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("body_len", &self.body.len())
            .field("headers", &self.headers)
            .finish()
    }
}

/// Why a wire message could not be turned into a typed envelope.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// No `type` header.
    #[error("missing header `{header}`")]
    MissingHeader {
        /// The missing header's name.
        header: &'static str,
    },
    /// The `type` names no registered message.
    #[error("unknown message type `{name}` (no message registered under that wire name)")]
    UnknownType {
        /// The wire name found.
        name: String,
    },
    /// The `content-type` is not JSON.
    #[error("unsupported content type `{content_type}` (expected application/json)")]
    UnsupportedContentType {
        /// The content type found.
        content_type: String,
    },
    /// The body is not valid JSON for the message type.
    #[error("invalid JSON body for message type `{name}`")]
    InvalidBody {
        /// The wire name.
        name: String,
        /// The JSON error (line and column, never the body).
        #[source]
        source: serde_json::Error,
    },
    /// A stamp header is not a JSON list.
    #[error("invalid stamp header `{header}` (expected a JSON list)")]
    InvalidStampHeader {
        /// The header name.
        header: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The stored headers are not a JSON object of strings.
    #[error("invalid headers (expected a JSON object of string values)")]
    InvalidHeaders {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// Could not encode an envelope.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode message `{name}` as JSON")]
pub struct EncodeError {
    /// The wire name.
    pub name: String,
    /// The serde error.
    #[source]
    pub source: serde_json::Error,
}

type DecodeFn = fn(&str) -> Result<Arc<dyn AnyMessage>, serde_json::Error>;

fn decode_as<M: Message>(body: &str) -> Result<Arc<dyn AnyMessage>, serde_json::Error> {
    Ok(Arc::new(serde_json::from_str::<M>(body)?))
}

/// Maps wire names to message types, and encodes / decodes envelopes.
#[derive(Clone, Default)]
pub struct MessageRegistry {
    decoders: HashMap<&'static str, DecodeFn>,
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
        self.decoders.insert(M::NAME, decode_as::<M>);
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
        // Room for the stamps a receiving worker adds (id, delivery tag, received, handled).
        let mut stamps = Vec::with_capacity(headers.len() + 4);
        let mut stamp_error = None;
        let (mut name, mut content_type) = (None, None);
        let mut extra = BTreeMap::new();
        for (key, value) in headers {
            if let Some(stamp) = key.strip_prefix(STAMP_HEADER_PREFIX) {
                match serde_json::from_str::<Vec<Box<RawValue>>>(&value) {
                    Ok(items) => stamps.extend(
                        items
                            .into_iter()
                            .map(|json| Slot::Raw(Arc::new(RawSlot::new(stamp, json)))),
                    ),
                    Err(source) => {
                        stamp_error.get_or_insert(DecodeError::InvalidStampHeader {
                            header: key.clone(),
                            source,
                        });
                    }
                }
                continue;
            }
            match key.as_str() {
                TYPE_HEADER => name = Some(value),
                CONTENT_TYPE_HEADER => content_type = Some(value),
                _ => {
                    extra.insert(key, value);
                }
            }
        }
        let extra_headers = (!extra.is_empty()).then(|| Arc::new(extra));
        let error = match (&name, stamp_error) {
            (_, Some(e)) => Err(e),
            (None, None) => Err(DecodeError::MissingHeader {
                header: TYPE_HEADER,
            }),
            (Some(_), None)
                if content_type
                    .as_deref()
                    .is_some_and(|c| !c.starts_with(JSON_CONTENT_TYPE)) =>
            {
                Err(DecodeError::UnsupportedContentType {
                    content_type: content_type.unwrap_or_default(),
                })
            }
            (Some(n), None) => match self.decoders.get_key_value(n.as_str()) {
                None => Err(DecodeError::UnknownType { name: n.clone() }),
                Some((wire_name, decode)) => decode(&body)
                    .map(|message| (*wire_name, message))
                    .map_err(|source| DecodeError::InvalidBody {
                        name: n.clone(),
                        source,
                    }),
            },
        };
        let payload = match error {
            Ok((name, message)) => Payload::Typed {
                name,
                message,
                body: Some(Arc::from(body)),
            },
            Err(error) => Payload::Undecodable {
                name: name.map(Arc::from),
                body: Arc::from(body),
                error: Arc::new(error),
            },
        };
        Envelope {
            payload,
            stamps,
            extra_headers,
        }
    }
}

use crate::Envelope;

/// Encodes an envelope (see [`MessageRegistry::encode`]); needs no registry.
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode(envelope: &Envelope) -> Result<Encoded, EncodeError> {
    let (name, body) = match &envelope.payload {
        Payload::Typed {
            name,
            body: Some(body),
            ..
        } => (Some(*name), body.to_string()),
        Payload::Typed {
            name,
            message,
            body: None,
        } => (
            Some(*name),
            message.encode().map_err(|source| EncodeError {
                name: name.to_string(),
                source,
            })?,
        ),
        Payload::Undecodable { name, body, .. } => (name.as_deref(), body.to_string()),
    };
    let mut headers = envelope
        .extra_headers
        .as_deref()
        .cloned()
        .unwrap_or_default();
    if let Some(name) = name {
        headers.insert(TYPE_HEADER.to_owned(), name.to_string());
    }
    headers.insert(CONTENT_TYPE_HEADER.to_owned(), JSON_CONTENT_TYPE.to_owned());
    // One JSON list per stamp kind, written straight into its header value.
    let mut groups: BTreeMap<&str, String> = BTreeMap::new();
    for slot in &envelope.stamps {
        let stamp_name = match slot {
            Slot::Typed(s) if s.sendable() => s.name(),
            Slot::Typed(_) => continue,
            Slot::Raw(r) => &*r.name,
        };
        let list = groups
            .entry(stamp_name)
            .or_insert_with(|| String::from("["));
        if list.len() > 1 {
            list.push(',');
        }
        match slot {
            Slot::Typed(s) => s.write_json(list).map_err(|source| EncodeError {
                name: format!("stamp {}", s.name()),
                source,
            })?,
            Slot::Raw(r) => list.push_str(r.json.get()),
        }
    }
    for (stamp_name, mut list) in groups {
        list.push(']');
        headers.insert(format!("{STAMP_HEADER_PREFIX}{stamp_name}"), list);
    }
    Ok(Encoded { body, headers })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DelayStamp, ErrorDetailsStamp, HandledStamp, ReceivedStamp};
    use serde::{Deserialize, Serialize};
    use std::time::Duration;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Greet {
        who: String,
    }
    impl Message for Greet {
        const NAME: &'static str = "test.greet";
    }

    fn registry() -> MessageRegistry {
        MessageRegistry::new().with::<Greet>()
    }

    #[test]
    fn a_hand_written_message_from_another_language_decodes() {
        let wire = Encoded::new(r#"{ "who": "wörld" }"#)
            .header("type", "test.greet")
            .header("content-type", "application/json")
            .header("x-courier-stamp-delay", "[250]")
            .header("x-trace", "abc");
        let env = registry().decode(wire);
        assert!(env.decode_error().is_none(), "{:?}", env.decode_error());
        assert_eq!(
            env.message::<Greet>(),
            Some(&Greet {
                who: "wörld".into()
            })
        );
        assert_eq!(
            env.last::<DelayStamp>(),
            Some(&DelayStamp(Duration::from_millis(250)))
        );
        assert_eq!(
            env.extra_headers()
                .and_then(|h| h.get("x-trace"))
                .map(String::as_str),
            Some("abc")
        );
    }

    #[test]
    fn encode_writes_sendable_stamps_as_json_lists_and_drops_local_ones() {
        let env = Envelope::new(Greet { who: "a".into() })
            .with(HandledStamp {
                handler: "h1".into(),
            })
            .with(HandledStamp {
                handler: "h2".into(),
            })
            .with(ReceivedStamp("async".into()));
        let wire = encode(&env).unwrap_or_default();
        assert_eq!(wire.body, r#"{"who":"a"}"#);
        assert_eq!(wire.headers["type"], "test.greet");
        assert_eq!(wire.headers["content-type"], "application/json");
        assert_eq!(
            wire.headers["x-courier-stamp-handled"],
            r#"[{"handler":"h1"},{"handler":"h2"}]"#
        );
        assert!(!wire.headers.contains_key("x-courier-stamp-received"));
    }

    #[test]
    fn decode_then_encode_is_byte_for_byte() {
        let env = Envelope::new(Greet {
            who: "ünïcode ✓".into(),
        })
        .with(ErrorDetailsStamp::new("c", "m", vec!["x".into()]))
        .with(DelayStamp(Duration::from_millis(7)));
        let first = encode(&env).unwrap_or_default();
        let again = encode(&registry().decode(first.clone())).unwrap_or_default();
        assert_eq!(first, again);
    }

    #[test]
    fn unknown_type_is_a_decode_error_naming_the_type() {
        let env = registry().decode(Encoded::new("{}").header("type", "nope.nope"));
        let err = env
            .decode_error()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(err.contains("unknown message type `nope.nope`"), "{err}");
        assert_eq!(env.message_name(), "nope.nope");
    }

    #[test]
    fn bad_json_is_a_decode_error_naming_the_type() {
        let env = registry().decode(Encoded::new("{not json").header("type", "test.greet"));
        assert!(
            matches!(env.decode_error(), Some(DecodeError::InvalidBody { name, .. }) if name == "test.greet")
        );
    }

    #[test]
    fn missing_type_header_is_a_decode_error() {
        let env = registry().decode(Encoded::new(r#"{"who":"a"}"#));
        assert!(matches!(
            env.decode_error(),
            Some(DecodeError::MissingHeader { header: "type" })
        ));
    }

    #[test]
    fn a_malformed_stamp_header_is_a_decode_error_naming_the_header() {
        let env = registry().decode(
            Encoded::new(r#"{"who":"a"}"#)
                .header("type", "test.greet")
                .header("x-courier-stamp-delay", "5"),
        );
        let err = env
            .decode_error()
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(err.contains("x-courier-stamp-delay"), "{err}");
    }

    #[test]
    fn an_undecodable_message_encodes_back_to_its_raw_body() {
        let wire = Encoded::new("{not json").header("type", "test.greet");
        let env = registry().decode(wire);
        let again = encode(&env).unwrap_or_default();
        assert_eq!(again.body, "{not json");
        assert_eq!(again.headers["type"], "test.greet");
    }
}
