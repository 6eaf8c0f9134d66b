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
//! Any other header is kept verbatim. A message that does not decode keeps its wire form: sent
//! on (to the failure transport, and back by `failed retry`) it has the same body bytes and
//! headers, plus the stamps added since, so it stays undecodable for the same reason. A body
//! that is not UTF-8 travels as base64 under `x-courier-body-encoding: base64`, and headers
//! that were not a JSON object travel verbatim in `x-courier-raw-headers`.
//!
//! A producer in another language enqueues a message by writing that body and the `type`
//! header:
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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;

use crate::Message;
use crate::envelope::{RawSlot, Slot};
use crate::message::{AnyMessage, Payload};

mod raw;

pub(crate) use raw::RawParts;
pub use raw::{
    BASE64_ENCODING, BODY_ENCODING_HEADER, RAW_HEADERS_BASE64_HEADER, RAW_HEADERS_HEADER,
};
use raw::{ContentType, push_raw_headers, unreadable_headers};
use raw::{base64_decode, base64_encode};

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

    /// The headers as one JSON object (the SQL `headers` column and the Redis `headers` field),
    /// keys in sorted order: the same text [`encode_json`] writes.
    #[must_use]
    pub fn headers_json(&self) -> String {
        let mut json = String::with_capacity(64 * self.headers.len() + 2);
        write_object(
            &mut json,
            self.headers
                .iter()
                .map(|(k, v)| (("", k.as_str()), v.as_str())),
        );
        json
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
    /// The body's bytes are not UTF-8 text (a binary body, or a value of another type read
    /// as bytes).
    #[error("body is not UTF-8 text")]
    BodyNotText {
        /// Where the bytes stop being UTF-8.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The body's [`BODY_ENCODING_HEADER`] is unknown, or the body does not decode with it.
    #[error("body does not decode as `{encoding}` (the only known body encoding is base64)")]
    InvalidBodyEncoding {
        /// The encoding named.
        encoding: String,
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
        let mut sink = HeaderSink::with_capacity(headers.len());
        for (key, value) in headers {
            sink.push(Cow::Owned(key), Cow::Owned(value));
        }
        sink.finish(self, body)
    }

    /// Decodes a message stored as a body and its headers as one JSON object (the form
    /// [`encode_json`] writes), without building the header map first. Never fails: headers
    /// that are not a JSON object of strings give an envelope whose
    /// [`Envelope::decode_error`] is [`DecodeError::InvalidHeaders`], with its body kept.
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
            Ok(sink) => sink.finish(self, body),
            Err(source) => unreadable_headers(body.into_bytes(), headers.as_bytes(), source),
        }
    }

    /// Decodes a message whose body may not be UTF-8 text (an AMQP body, say). Never fails: a
    /// body that is not UTF-8 gives an envelope whose [`Envelope::decode_error`] is
    /// [`DecodeError::BodyNotText`], keeping the bytes (see [`Envelope::undecodable_body`]).
    #[must_use]
    pub fn decode_bytes(&self, body: Vec<u8>, headers: BTreeMap<String, String>) -> Envelope {
        match String::from_utf8(body) {
            Ok(body) => self.decode(Encoded { body, headers }),
            Err(e) => {
                let mut sink = HeaderSink::with_capacity(headers.len());
                for (key, value) in headers {
                    sink.push(Cow::Owned(key), Cow::Owned(value));
                }
                sink.finish_not_text(self, e)
            }
        }
    }

    /// A decoder for a batch of messages in the [`decode_json`](Self::decode_json) form, which
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
    registry: &'r MessageRegistry,
    last: Option<(String, Prepared)>,
    /// Whether a message was decoded already: the first one is not remembered, so a batch of
    /// one costs no more than [`MessageRegistry::decode_json`].
    warm: bool,
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
                Ok(sink) => sink.finish_not_text(self.registry, e),
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
            Ok(sink) => match sink.prepare(self.registry) {
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

/// Headers that name a registered type and carry well-formed stamps: all that is left to do for
/// a message is to decode its body.
struct Prepared {
    name: &'static str,
    decode: DecodeFn,
    stamps: Vec<Slot>,
    extra_headers: Option<Arc<BTreeMap<String, String>>>,
    content_type: ContentType,
    /// The body is base64 ([`BODY_ENCODING_HEADER`]).
    base64: bool,
}

impl Prepared {
    fn envelope(&self, body: String) -> Envelope {
        let mut stamps = Vec::with_capacity(self.stamps.len() + 4);
        stamps.extend(self.stamps.iter().cloned());
        Self::finish(self.parts(), stamps, self.extra_headers.clone(), body)
    }

    fn into_envelope(self, body: String) -> Envelope {
        let Self {
            name,
            decode,
            stamps,
            extra_headers,
            content_type,
            base64,
        } = self;
        let parts = Parts {
            name,
            decode,
            content_type: &content_type,
            base64,
        };
        Self::finish(parts, stamps, extra_headers, body)
    }

    fn parts(&self) -> Parts<'_> {
        Parts {
            name: self.name,
            decode: self.decode,
            content_type: &self.content_type,
            base64: self.base64,
        }
    }

    fn finish(
        parts: Parts<'_>,
        stamps: Vec<Slot>,
        extra_headers: Option<Arc<BTreeMap<String, String>>>,
        body: String,
    ) -> Envelope {
        let undecodable = |body: Vec<u8>, error: DecodeError, body_encoding: Option<String>| {
            Payload::Undecodable {
                name: Some(Arc::from(parts.name)),
                body: Arc::from(body),
                error: Arc::new(error),
                raw: Arc::new(RawParts {
                    content_type: parts.content_type.header(),
                    body_encoding,
                    ..RawParts::default()
                }),
            }
        };
        let text = if parts.base64 {
            match base64_decode(&body).map(String::from_utf8) {
                Some(Ok(text)) => Ok(text),
                Some(Err(e)) => Err(undecodable(
                    e.as_bytes().to_vec(),
                    DecodeError::BodyNotText {
                        source: e.utf8_error(),
                    },
                    None,
                )),
                None => Err(undecodable(
                    body.into_bytes(),
                    DecodeError::InvalidBodyEncoding {
                        encoding: BASE64_ENCODING.to_owned(),
                    },
                    Some(BASE64_ENCODING.to_owned()),
                )),
            }
        } else {
            Ok(body)
        };
        let payload = match text {
            Ok(body) => match (parts.decode)(&body) {
                Ok(message) => Payload::Typed {
                    name: parts.name,
                    message,
                    body: Some(Arc::from(body)),
                },
                Err(source) => undecodable(
                    body.into_bytes(),
                    DecodeError::InvalidBody {
                        name: parts.name.to_owned(),
                        source,
                    },
                    None,
                ),
            },
            Err(payload) => payload,
        };
        Envelope {
            payload,
            stamps,
            extra_headers,
        }
    }
}

/// What [`Prepared::finish`] needs of a [`Prepared`] besides its stamps.
#[derive(Clone, Copy)]
struct Parts<'p> {
    name: &'static str,
    decode: DecodeFn,
    content_type: &'p ContentType,
    base64: bool,
}

/// Headers that do not name a usable type: every message carrying them is undecodable.
struct Rejected {
    name: Option<String>,
    error: DecodeError,
    stamps: Vec<Slot>,
    extra_headers: Option<Arc<BTreeMap<String, String>>>,
    raw: Box<RawParts>,
}

impl Rejected {
    fn envelope(mut self, body: Vec<u8>) -> Envelope {
        // A base64 body is kept as its bytes (written back as base64 when they are not text);
        // one that is not base64 is kept as it came, with its encoding header.
        let body = match self.raw.body_encoding.as_deref() {
            Some(BASE64_ENCODING) => {
                match std::str::from_utf8(&body).ok().and_then(base64_decode) {
                    Some(bytes) => {
                        self.raw.body_encoding = None;
                        bytes
                    }
                    None => body,
                }
            }
            _ => body,
        };
        Envelope {
            payload: Payload::Undecodable {
                name: self.name.map(Arc::from),
                body: Arc::from(body),
                error: Arc::new(self.error),
                raw: Arc::from(self.raw),
            },
            stamps: self.stamps,
            extra_headers: self.extra_headers,
        }
    }
}

/// A JSON string, borrowed when it has no escapes.
#[derive(serde::Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

/// Reads a headers object straight into a sink, borrowing every string without escapes.
impl<'de> serde::Deserialize<'de> for HeaderSink<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = HeaderSink<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of string values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut sink = HeaderSink::with_capacity(map.size_hint().unwrap_or(2));
                while let Some((Text(k), Text(v))) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    sink.push(k, v);
                }
                Ok(sink)
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// Sorts headers into the parts of an envelope, one header at a time; `type` and
/// `content-type` stay borrowed from the wire text where they can.
struct HeaderSink<'a> {
    stamps: Vec<Slot>,
    stamp_error: Option<DecodeError>,
    /// Stamp headers that are not JSON lists, verbatim.
    bad_stamps: Vec<(String, String)>,
    name: Option<Cow<'a, str>>,
    content_type: Option<Cow<'a, str>>,
    body_encoding: Option<Cow<'a, str>>,
    extra: BTreeMap<String, String>,
}

impl<'a> HeaderSink<'a> {
    fn with_capacity(headers: usize) -> Self {
        Self {
            // Room for the stamps a receiving worker adds (id, delivery tag, received, handled).
            stamps: Vec::with_capacity(headers + 4),
            stamp_error: None,
            bad_stamps: Vec::new(),
            name: None,
            content_type: None,
            body_encoding: None,
            extra: BTreeMap::new(),
        }
    }

    fn push(&mut self, key: Cow<'_, str>, value: Cow<'a, str>) {
        if let Some(stamp) = key.strip_prefix(STAMP_HEADER_PREFIX) {
            match serde_json::from_str::<Vec<Box<RawValue>>>(&value) {
                Ok(items) => self.stamps.extend(
                    items
                        .into_iter()
                        .map(|json| Slot::Raw(Arc::new(RawSlot::new(stamp, json)))),
                ),
                Err(source) => {
                    self.stamp_error
                        .get_or_insert(DecodeError::InvalidStampHeader {
                            header: key.clone().into_owned(),
                            source,
                        });
                    self.bad_stamps.push((key.into_owned(), value.into_owned()));
                }
            }
            return;
        }
        match &*key {
            TYPE_HEADER => self.name = Some(value),
            CONTENT_TYPE_HEADER => self.content_type = Some(value),
            BODY_ENCODING_HEADER => self.body_encoding = Some(value),
            _ => {
                self.extra.insert(key.into_owned(), value.into_owned());
            }
        }
    }

    fn finish(self, registry: &MessageRegistry, body: String) -> Envelope {
        match self.prepare(registry) {
            Ok(prepared) => prepared.into_envelope(body),
            Err(rejected) => rejected.envelope(body.into_bytes()),
        }
    }

    /// The envelope of a message whose body is not UTF-8: undecodable whatever its headers say.
    fn finish_not_text(
        self,
        registry: &MessageRegistry,
        e: std::string::FromUtf8Error,
    ) -> Envelope {
        let error = DecodeError::BodyNotText {
            source: e.utf8_error(),
        };
        let body = e.into_bytes();
        match self.prepare(registry) {
            Ok(p) => Rejected {
                name: Some(p.name.to_owned()),
                error,
                stamps: p.stamps,
                extra_headers: p.extra_headers,
                raw: Box::new(RawParts {
                    content_type: p.content_type.header(),
                    ..RawParts::default()
                }),
            }
            .envelope(body),
            Err(mut rejected) => {
                // The bytes are kept as they are; a body encoding named does not apply to them.
                rejected.raw.body_encoding = None;
                rejected.envelope(body)
            }
        }
    }

    /// Resolves the type: the decoder to run on each body, or why there is none.
    fn prepare(self, registry: &MessageRegistry) -> Result<Prepared, Rejected> {
        let Self {
            stamps,
            stamp_error,
            bad_stamps,
            name,
            content_type,
            body_encoding,
            extra,
        } = self;
        let extra_headers = (!extra.is_empty()).then(|| Arc::new(extra));
        let error = match (&name, stamp_error) {
            (_, Some(e)) => e,
            (None, None) => DecodeError::MissingHeader {
                header: TYPE_HEADER,
            },
            (Some(_), None)
                if content_type
                    .as_deref()
                    .is_some_and(|c| !c.starts_with(JSON_CONTENT_TYPE)) =>
            {
                DecodeError::UnsupportedContentType {
                    content_type: content_type.as_deref().unwrap_or_default().to_owned(),
                }
            }
            (Some(_), None)
                if body_encoding
                    .as_deref()
                    .is_some_and(|e| e != BASE64_ENCODING) =>
            {
                DecodeError::InvalidBodyEncoding {
                    encoding: body_encoding.as_deref().unwrap_or_default().to_owned(),
                }
            }
            (Some(n), None) => match registry.decoders.get_key_value(&**n) {
                Some((name, decode)) => {
                    return Ok(Prepared {
                        name,
                        decode: *decode,
                        stamps,
                        extra_headers,
                        content_type: ContentType::new(content_type),
                        base64: body_encoding.is_some(),
                    });
                }
                None => DecodeError::UnknownType {
                    name: n.clone().into_owned(),
                },
            },
        };
        Err(Rejected {
            name: name.map(Cow::into_owned),
            error,
            stamps,
            extra_headers,
            raw: Box::new(RawParts {
                content_type: content_type.map(Cow::into_owned),
                bad_stamp_headers: bad_stamps,
                body_encoding: body_encoding.map(Cow::into_owned),
                unreadable_headers: None,
            }),
        })
    }
}

use crate::Envelope;

/// Encodes an envelope (see [`MessageRegistry::encode`]); needs no registry.
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode(envelope: &Envelope) -> Result<Encoded, EncodeError> {
    let mut body = String::new();
    write_body(envelope, &mut body)?;
    Ok(Encoded {
        body,
        headers: header_list(envelope)?
            .into_iter()
            .map(|((prefix, name), value)| (format!("{prefix}{name}"), value.into_owned()))
            .collect(),
    })
}

/// An envelope in the form SQL rows and Redis entries store it: the body, and the headers as
/// one JSON object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedJson {
    /// The message as JSON text.
    pub body: String,
    /// The headers as one JSON object, keys sorted: the same text as
    /// [`Encoded::headers_json`] of [`encode`]'s result.
    pub headers: String,
}

/// Encodes an envelope with its headers written straight to one JSON object, without the
/// header map [`encode`] builds; [`MessageRegistry::decode_json`] reads it back.
///
/// ```
/// # use courier_core::{Envelope, Message, encode, encode_json};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
/// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
/// let envelope = Envelope::new(Ping { n: 7 });
/// let wire = encode_json(&envelope).unwrap();
/// assert_eq!(wire.body, r#"{"n":7}"#);
/// assert_eq!(wire.headers, r#"{"content-type":"application/json","type":"app.ping"}"#);
/// assert_eq!(wire.headers, encode(&envelope).unwrap().headers_json());
/// ```
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode_json(envelope: &Envelope) -> Result<EncodedJson, EncodeError> {
    let mut out = EncodedJson::default();
    encode_json_into(envelope, &mut out)?;
    Ok(out)
}

/// [`encode_json`] into buffers that are reused from one message to the next: for a batch
/// whose text is copied out of `out` (into a Redis command, say) after each message.
///
/// ```
/// # use courier_core::{EncodedJson, Envelope, Message, encode_json, encode_json_into};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
/// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
/// let mut out = EncodedJson::default();
/// for n in 0..3 {
///     let envelope = Envelope::new(Ping { n });
///     encode_json_into(&envelope, &mut out).unwrap();
///     assert_eq!(out, encode_json(&envelope).unwrap());
/// }
/// ```
///
/// # Errors
/// [`EncodeError`] if the message does not serialize; `out` then holds no usable text.
pub fn encode_json_into(envelope: &Envelope, out: &mut EncodedJson) -> Result<(), EncodeError> {
    out.body.clear();
    out.headers.clear();
    write_body(envelope, &mut out.body)?;
    let plain = envelope.extra_headers.is_none()
        && matches!(envelope.payload, Payload::Typed { .. })
        && envelope.stamps.iter().all(|slot| match slot {
            Slot::Typed(s) => !s.sendable(),
            Slot::Raw(_) => false,
        });
    if plain {
        // Only `content-type` and `type`, already in key order.
        write_object(
            &mut out.headers,
            [(("", CONTENT_TYPE_HEADER), JSON_CONTENT_TYPE)]
                .into_iter()
                .chain(payload_name(envelope).map(|name| (("", TYPE_HEADER), name))),
        );
        return Ok(());
    }
    let headers = header_list(envelope)?;
    let len: usize = headers
        .iter()
        .map(|((p, n), v)| p.len() + n.len() + v.len() + 8)
        .sum();
    out.headers.reserve(len + 2);
    write_object(
        &mut out.headers,
        headers.iter().map(|(key, value)| (*key, value.as_ref())),
    );
    Ok(())
}

/// A header name as a prefix and the rest (`x-courier-stamp-` and `delay`), so stamp headers
/// need no allocation of their own.
pub(crate) type HeaderKey<'a> = (&'static str, &'a str);

/// Headers by name, values borrowed from the envelope where they can be.
pub(crate) type Headers<'a> = Vec<(HeaderKey<'a>, Cow<'a, str>)>;

/// The wire name the payload carries, if any.
fn payload_name(envelope: &Envelope) -> Option<&str> {
    match &envelope.payload {
        Payload::Typed { name, .. } => Some(name),
        Payload::Undecodable { name, .. } => name.as_deref(),
    }
}

/// Appends the message's JSON text: the text it was read with, or the message serialized.
fn write_body(envelope: &Envelope, out: &mut String) -> Result<(), EncodeError> {
    match &envelope.payload {
        Payload::Typed {
            body: Some(body), ..
        } => {
            out.push_str(body);
            Ok(())
        }
        Payload::Undecodable { body, .. } => {
            match std::str::from_utf8(body) {
                Ok(text) => out.push_str(text),
                Err(_) => base64_encode(body, out),
            }
            Ok(())
        }
        Payload::Typed {
            name,
            message,
            body: None,
        } => {
            let mut bytes = std::mem::take(out).into_bytes();
            let written = message.encode_into(&mut bytes);
            // serde_json writes UTF-8; the lossy branch is never taken.
            *out = String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
            written.map_err(|source| EncodeError {
                name: (*name).to_owned(),
                source,
            })
        }
    }
}

/// The headers of an envelope sorted by name with no duplicates: what the envelope itself sets
/// (type, content type, one JSON list per stamp kind) wins over an extra header of the same
/// name. An undecodable envelope gets back the headers it was read with (see
/// [`push_raw_headers`]), plus the stamps it carries now.
fn header_list(envelope: &Envelope) -> Result<Headers<'_>, EncodeError> {
    let name = payload_name(envelope);
    let extra = envelope.extra_headers.as_deref();
    let mut headers: Headers<'_> = Vec::with_capacity(4 + extra.map_or(0, BTreeMap::len));
    if let Some(name) = name {
        headers.push((("", TYPE_HEADER), Cow::Borrowed(name)));
    }
    match &envelope.payload {
        Payload::Typed { .. } => {
            headers.push((("", CONTENT_TYPE_HEADER), Cow::Borrowed(JSON_CONTENT_TYPE)));
        }
        Payload::Undecodable { body, raw, .. } => push_raw_headers(&mut headers, body, raw),
    }
    // One JSON list per stamp kind, written straight into its header value, oldest first.
    let first_stamp = headers.len();
    for slot in &envelope.stamps {
        let stamp_name = match slot {
            Slot::Typed(s) if s.sendable() => s.name(),
            Slot::Typed(_) => continue,
            Slot::Raw(r) => &*r.name,
        };
        let at = headers[first_stamp..]
            .iter()
            .position(|((_, n), _)| *n == stamp_name);
        let list = match at {
            Some(i) => {
                let list = headers[first_stamp + i].1.to_mut();
                list.push(',');
                list
            }
            None => {
                headers.push((
                    (STAMP_HEADER_PREFIX, stamp_name),
                    Cow::Owned("[".to_owned()),
                ));
                let last = headers.len() - 1;
                headers[last].1.to_mut()
            }
        };
        match slot {
            Slot::Typed(s) => s.write_json(list).map_err(|source| EncodeError {
                name: format!("stamp {}", s.name()),
                source,
            })?,
            Slot::Raw(r) => list.push_str(r.json.get()),
        }
    }
    for (_, list) in &mut headers[first_stamp..] {
        list.to_mut().push(']');
    }
    if let Some(extra) = extra {
        headers.extend(
            extra
                .iter()
                .map(|(k, v)| (("", k.as_str()), Cow::Borrowed(v.as_str()))),
        );
    }
    // A stable sort keeps the envelope's own header ahead of an extra one of the same name.
    headers.sort_by(|((p1, n1), _), ((p2, n2), _)| {
        p1.bytes()
            .chain(n1.bytes())
            .cmp(p2.bytes().chain(n2.bytes()))
    });
    headers.dedup_by(|((p1, n1), _), ((p2, n2), _)| {
        p1.len() + n1.len() == p2.len() + n2.len()
            && p1
                .bytes()
                .chain(n1.bytes())
                .eq(p2.bytes().chain(n2.bytes()))
    });
    Ok(headers)
}

/// Writes `{"key":"value",...}` as serde_json writes a map of strings, in the order given.
fn write_object<'a>(out: &mut String, headers: impl Iterator<Item = (HeaderKey<'a>, &'a str)>) {
    out.push('{');
    for (i, ((prefix, name), value)) in headers.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        escape_into(out, prefix);
        escape_into(out, name);
        out.push_str("\":\"");
        escape_into(out, value);
        out.push('"');
    }
    out.push('}');
}

/// Appends `s` escaped as the inside of a JSON string, byte for byte as serde_json does it.
fn escape_into(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            out.push_str(short);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
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

    /// What the worker does to an undecodable envelope it moves to the failure transport.
    fn moved_to_failure(env: Envelope) -> Envelope {
        env.with_error_details(ErrorDetailsStamp::new("decode", "undecodable", vec![]))
            .with(crate::SentToFailureTransportStamp::new("async"))
            .without_all::<DelayStamp>()
    }

    /// Poison messages as stored: body bytes and headers (`Err`: headers that are no map).
    /// Stored headers: a map, or bytes that are no map.
    type StoredHeaders = Result<BTreeMap<String, String>, Vec<u8>>;

    fn poisons() -> Vec<(&'static str, Vec<u8>, StoredHeaders)> {
        let map = |pairs: &[(&str, &str)]| {
            Ok(pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect())
        };
        vec![
            (
                "content type",
                br#"{"who":"a"}"#.to_vec(),
                map(&[("type", "test.greet"), ("content-type", "text/plain")]),
            ),
            (
                "bad stamp header",
                br#"{"who":"a"}"#.to_vec(),
                map(&[
                    ("type", "test.greet"),
                    ("x-courier-stamp-redelivery", "{oops"),
                ]),
            ),
            (
                "bad stamp header beside a good one",
                br#"{"who":"a"}"#.to_vec(),
                map(&[
                    ("type", "test.greet"),
                    ("x-courier-stamp-handled", "nope"),
                    ("x-courier-stamp-delay", "[5]"),
                    ("x-extra", "kept"),
                ]),
            ),
            (
                "unknown type",
                br#"{"who":"a"}"#.to_vec(),
                map(&[
                    ("type", "test.nobody"),
                    ("content-type", "application/json"),
                ]),
            ),
            (
                "bad json",
                b"{not json".to_vec(),
                map(&[("type", "test.greet")]),
            ),
            ("no type", br#"{"who":"a"}"#.to_vec(), map(&[])),
            (
                "binary body",
                b"\xff\xfe{\"who\":\"a\"}".to_vec(),
                map(&[("type", "test.greet"), ("content-type", "application/json")]),
            ),
            (
                "unknown body encoding",
                br#"{"who":"a"}"#.to_vec(),
                map(&[("type", "test.greet"), ("x-courier-body-encoding", "gzip")]),
            ),
            (
                "base64 body that is not base64",
                br#"{"who":"a"}"#.to_vec(),
                map(&[
                    ("type", "test.greet"),
                    ("x-courier-body-encoding", "base64"),
                ]),
            ),
            (
                "headers not json",
                br#"{"who":"a"}"#.to_vec(),
                Err(b"not json".to_vec()),
            ),
            (
                "headers not text",
                b"\x80body".to_vec(),
                Err(b"{\"type\":\"test.greet\xff\"}".to_vec()),
            ),
        ]
    }

    fn stored(body: &[u8], headers: &StoredHeaders) -> Envelope {
        match headers {
            Ok(map) => registry().decode_bytes(body.to_vec(), map.clone()),
            Err(bytes) => registry()
                .json_decoder()
                .decode_bytes(body.to_vec(), Some(bytes)),
        }
    }

    #[test]
    fn an_undecodable_message_moved_to_another_transport_comes_back_as_it_was() {
        let without_failure_stamps = |e: Envelope| {
            e.without_all::<ErrorDetailsStamp>()
                .without_all::<crate::SentToFailureTransportStamp>()
        };
        for (what, body, headers) in poisons() {
            let first = stored(&body, &headers);
            assert!(first.decode_error().is_some(), "{what}");
            assert_eq!(first.undecodable_body(), Some(&body[..]), "{what}");
            let sent = moved_to_failure(first.clone());
            // Through a transport that stores a header map (AMQP, in-memory) ...
            let wire = encode(&sent).unwrap_or_default();
            let back = registry().decode(wire.clone());
            // ... and one that stores the headers as one JSON text (SQL, Redis).
            let json = encode_json(&sent).unwrap_or_default();
            let back_json = registry().json_decoder().decode_bytes(
                json.body.clone().into_bytes(),
                Some(json.headers.as_bytes()),
            );
            for back in [back, back_json] {
                assert!(back.decode_error().is_some(), "{what}: still undecodable");
                assert_eq!(
                    back.undecodable_body(),
                    Some(&body[..]),
                    "{what}: same bytes"
                );
                assert_eq!(back.message_name(), first.message_name(), "{what}");
                assert!(back.last::<ErrorDetailsStamp>().is_some(), "{what}");
                assert!(
                    back.last::<crate::SentToFailureTransportStamp>().is_some(),
                    "{what}"
                );
                assert_eq!(encode(&back).ok(), Some(wire.clone()), "{what}: stable");
                // Retried: the failure stamps go, the message is the one first stored.
                let retried = without_failure_stamps(back).without_all::<DelayStamp>();
                let again = registry().decode(encode(&retried).unwrap_or_default());
                assert!(
                    again.decode_error().is_some(),
                    "{what}: retried, still undecodable"
                );
                assert_eq!(again.undecodable_body(), Some(&body[..]), "{what}");
                if let Ok(original) = &headers {
                    let mut expected = original.clone();
                    expected.remove("x-courier-stamp-delay");
                    if std::str::from_utf8(&body).is_err() {
                        // Bytes that are not text travel as base64, and say so.
                        expected.insert(BODY_ENCODING_HEADER.to_owned(), "base64".to_owned());
                    }
                    assert_eq!(
                        encode(&retried).map(|w| w.headers).ok(),
                        Some(expected),
                        "{what}: the headers as stored"
                    );
                }
            }
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_named_and_travels_as_base64() {
        let env = registry()
            .json_decoder()
            .decode_bytes(vec![0xff, b'{', b'}'], Some(br#"{"type":"test.greet"}"#));
        assert!(
            matches!(env.decode_error(), Some(DecodeError::BodyNotText { .. })),
            "{:?}",
            env.decode_error()
        );
        let wire = encode(&env).unwrap_or_default();
        assert_eq!(wire.body, "/3t9");
        assert_eq!(wire.headers[BODY_ENCODING_HEADER], "base64");
        assert_eq!(wire.headers["type"], "test.greet");
    }

    #[test]
    fn a_base64_body_from_a_producer_decodes() {
        let env = registry().decode(
            Encoded::new("eyJ3aG8iOiJiNjQifQ==")
                .header("type", "test.greet")
                .header(BODY_ENCODING_HEADER, "base64"),
        );
        assert_eq!(env.message::<Greet>(), Some(&Greet { who: "b64".into() }));
        let wire = encode(&env).unwrap_or_default();
        assert_eq!(wire.body, r#"{"who":"b64"}"#);
        assert!(!wire.headers.contains_key(BODY_ENCODING_HEADER));
    }

    #[test]
    fn missing_headers_read_as_no_headers() {
        let env = registry()
            .json_decoder()
            .decode_bytes(br#"{"who":"a"}"#.to_vec(), None);
        assert!(matches!(
            env.decode_error(),
            Some(DecodeError::MissingHeader { header: "type" })
        ));
    }

    #[test]
    fn headers_json_escapes_exactly_as_serde_json() {
        let mut text: String = (0u8..0x80).map(char::from).collect();
        text.push_str("ünïcode ✓ \u{2028} \u{1F600} \\ \" end");
        let mut map = BTreeMap::new();
        map.insert(text.clone(), text.clone());
        map.insert("b".to_owned(), String::new());
        map.insert("a".to_owned(), "\"quoted\"".to_owned());
        let wire = Encoded {
            body: String::new(),
            headers: map.clone(),
        };
        let expected = serde_json::to_string(&map).unwrap_or_default();
        assert_eq!(wire.headers_json(), expected);
        assert_eq!(Encoded::parse_headers(&expected).unwrap_or_default(), map);
    }

    fn with_everything() -> Envelope {
        let wire = Encoded::new(r#"{"who":"a"}"#)
            .header("type", "test.greet")
            .header("x-courier-stamp-delay", "[5]")
            .header("a-first", "1")
            .header("zz-last", "line\nbreak \"q\"")
            .header("x-courier-stamp-zzz-custom", r#"[{"k":"v"}]"#);
        registry()
            .decode(wire)
            .with(ErrorDetailsStamp::new("c", "m\"\n", vec!["x".into()]))
            .with(DelayStamp(Duration::from_millis(9)))
            .with(ReceivedStamp("local".into()))
    }

    #[test]
    fn encode_json_is_the_same_text_as_encode_then_headers_json() {
        for env in [
            Envelope::new(Greet { who: "b".into() }),
            with_everything(),
            registry().decode(Encoded::new("{not json").header("type", "test.greet")),
            registry().decode(Encoded::new("{}").header("x-only", "extra")),
            registry().decode(Encoded::new("{}")),
            Envelope::new(Greet {
                who: "\"q\"\n".into(),
            })
            .with(ReceivedStamp("local".into())),
            registry().decode(Encoded::new(r#"{"who":"c"}"#).header("type", "test.greet")),
        ] {
            let slow = encode(&env).unwrap_or_default();
            let fast = encode_json(&env).map_err(|e| e.to_string());
            assert_eq!(
                fast,
                Ok(EncodedJson {
                    body: slow.body.clone(),
                    headers: slow.headers_json(),
                })
            );
        }
    }

    #[test]
    fn encode_json_into_reuses_its_buffers_without_leftovers() {
        let mut out = EncodedJson::default();
        for env in [
            with_everything(),
            Envelope::new(Greet { who: "b".into() }),
            registry().decode(Encoded::new("{not json").header("type", "test.greet")),
            Envelope::new(Greet { who: "c".into() }),
        ] {
            assert!(encode_json_into(&env, &mut out).is_ok());
            assert_eq!(Some(&out), encode_json(&env).ok().as_ref());
        }
    }

    #[test]
    fn an_extra_header_never_overrides_what_the_envelope_sets() {
        let mut extra = BTreeMap::new();
        extra.insert("type".to_owned(), "forged".to_owned());
        extra.insert("content-type".to_owned(), "text/plain".to_owned());
        extra.insert("x-courier-stamp-delay".to_owned(), "[1]".to_owned());
        let mut env =
            Envelope::new(Greet { who: "a".into() }).with(DelayStamp(Duration::from_millis(2)));
        env.extra_headers = Some(Arc::new(extra));
        let wire = encode(&env).unwrap_or_default();
        assert_eq!(wire.headers["type"], "test.greet");
        assert_eq!(wire.headers["content-type"], "application/json");
        assert_eq!(wire.headers["x-courier-stamp-delay"], "[2]");
        assert_eq!(
            encode_json(&env).map(|w| w.headers).unwrap_or_default(),
            wire.headers_json()
        );
    }

    #[test]
    fn decode_json_reads_what_decode_reads() {
        let env = with_everything();
        let wire = encode(&env).unwrap_or_default();
        let slow = registry().decode(wire.clone());
        let fast = registry().decode_json(wire.body.clone(), &wire.headers_json());
        assert!(fast.decode_error().is_none(), "{:?}", fast.decode_error());
        assert_eq!(
            encode(&fast).unwrap_or_default(),
            encode(&slow).unwrap_or_default()
        );
        assert_eq!(fast.extra_headers(), slow.extra_headers());
        assert_eq!(fast.message::<Greet>(), Some(&Greet { who: "a".into() }));
    }

    #[test]
    fn decode_json_names_headers_that_are_not_an_object_of_strings() {
        for bad in ["", "[]", r#"{"type": 5}"#, r#"{"type":"test.greet""#] {
            let env = registry().decode_json(r#"{"who":"a"}"#.to_owned(), bad);
            assert!(
                matches!(env.decode_error(), Some(DecodeError::InvalidHeaders { .. })),
                "{bad:?}: {:?}",
                env.decode_error()
            );
            assert_eq!(
                encode(&env).map(|w| w.body).unwrap_or_default(),
                r#"{"who":"a"}"#
            );
        }
    }

    /// What a [`JsonDecoder`] gives, as text: the decode error or the re-encoded wire form.
    fn outcome(env: &Envelope) -> String {
        match env.decode_error() {
            Some(e) => format!("error: {e}"),
            None => format!("{:?}", encode(env).unwrap_or_default()),
        }
    }

    #[test]
    fn a_json_decoder_gives_what_decode_json_gives_for_every_run_of_headers() {
        let with_stamps = encode(&with_everything())
            .unwrap_or_default()
            .headers_json();
        let plain = r#"{"content-type":"application/json","type":"test.greet"}"#.to_owned();
        let unknown = r#"{"type":"test.nobody"}"#.to_owned();
        let bad_stamp = r#"{"type":"test.greet","x-courier-stamp-delay":"nope"}"#.to_owned();
        let runs = [
            (&plain, r#"{"who":"a"}"#),
            (&plain, r#"{"who":"b"}"#),
            (&plain, r#"{"who":5}"#),
            (&plain, r#"{"who":"c"}"#),
            (&with_stamps, r#"{"who":"d"}"#),
            (&with_stamps, r#"{"who":"e"}"#),
            (&unknown, r#"{"who":"f"}"#),
            (&unknown, r#"{"who":"g"}"#),
            (&bad_stamp, r#"{"who":"h"}"#),
            (&plain, r#"{"who":"i"}"#),
        ];
        let registry = registry();
        let mut decoder = registry.json_decoder();
        for (headers, body) in runs {
            let batch = decoder.decode(body.to_owned(), headers);
            let alone = registry.decode_json(body.to_owned(), headers);
            assert_eq!(outcome(&batch), outcome(&alone), "{headers} {body}");
            assert_eq!(batch.extra_headers(), alone.extra_headers());
            assert_eq!(batch.message::<Greet>(), alone.message::<Greet>());
        }
    }

    #[test]
    fn envelopes_from_one_json_decoder_do_not_share_stamps() {
        let headers = encode(&with_everything())
            .unwrap_or_default()
            .headers_json();
        let registry = registry();
        let mut decoder = registry.json_decoder();
        let first = decoder
            .decode(r#"{"who":"a"}"#.to_owned(), &headers)
            .with(DelayStamp(Duration::from_secs(9)));
        let second = decoder.decode(r#"{"who":"b"}"#.to_owned(), &headers);
        assert_eq!(
            first.last::<DelayStamp>(),
            Some(&DelayStamp(Duration::from_secs(9)))
        );
        assert_ne!(
            second.last::<DelayStamp>(),
            Some(&DelayStamp(Duration::from_secs(9)))
        );
        assert_eq!(second.message::<Greet>(), Some(&Greet { who: "b".into() }));
    }
}
