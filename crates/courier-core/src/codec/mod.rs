//! The language-neutral wire format and the registry that maps wire names to message types.
//!
//! Files: `registry.rs` (the [`MessageRegistry`]: names to types), `encode.rs` (envelope to
//! wire), `decode.rs` (headers to the parts of an envelope), `decoder.rs` (the batch
//! [`JsonDecoder`]), `raw.rs` (what an undecodable message keeps of its wire form).
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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::Message;
use crate::message::AnyMessage;

mod decode;
mod decoder;
mod encode;
mod error;
mod raw;
mod registry;
mod serializer;
#[cfg(test)]
mod tests;

pub use decode::{HeaderPair, header_pairs};
pub use decoder::JsonDecoder;
use encode::write_object;
pub use encode::{
    EncodedJson, encode, encode_json, encode_json_into, encode_json_into_with, encode_json_with,
    encode_with,
};
pub use error::{DecodeError, EncodeError};
pub(crate) use raw::RawParts;
pub use raw::{
    BASE64_ENCODING, BODY_ENCODING_HEADER, RAW_HEADERS_BASE64_HEADER, RAW_HEADERS_HEADER,
};
pub use registry::MessageRegistry;
pub use serializer::{Serializer, UnknownSerializer};

/// The `type` header.
pub const TYPE_HEADER: &str = "type";
/// The `content-type` header.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// The content type of JSON bodies (the default).
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// The content type of MessagePack bodies ([`Serializer::MessagePack`]).
pub const MSGPACK_CONTENT_TYPE: &str = "application/msgpack";
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

/// The decoders of a [`MessageRegistry`], by wire name.
pub(crate) type Decoders = std::collections::HashMap<&'static str, DecodeFn>;

type JsonDecodeFn = fn(&str) -> Result<Arc<dyn AnyMessage>, serde_json::Error>;
type MsgpackDecodeFn = fn(&[u8]) -> Result<Arc<dyn AnyMessage>, rmp_serde::decode::Error>;

/// How one message type is read from each body format.
#[derive(Clone, Copy)]
pub(crate) struct DecodeFn {
    json: JsonDecodeFn,
    msgpack: MsgpackDecodeFn,
}

impl DecodeFn {
    fn of<M: Message>() -> Self {
        Self {
            json: decode_as::<M>,
            msgpack: decode_msgpack_as::<M>,
        }
    }
}

fn decode_as<M: Message>(body: &str) -> Result<Arc<dyn AnyMessage>, serde_json::Error> {
    Ok(Arc::new(serde_json::from_str::<M>(body)?))
}

fn decode_msgpack_as<M: Message>(
    body: &[u8],
) -> Result<Arc<dyn AnyMessage>, rmp_serde::decode::Error> {
    Ok(Arc::new(rmp_serde::from_slice::<M>(body)?))
}
