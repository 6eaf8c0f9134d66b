//! Why a message could not be encoded or decoded.

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
    /// The `content-type` is neither JSON nor MessagePack.
    #[error(
        "unsupported content type `{content_type}` (expected application/json or application/msgpack)"
    )]
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
    /// The body is not valid MessagePack for the message type.
    #[error("invalid MessagePack body for message type `{name}`")]
    InvalidMsgpackBody {
        /// The wire name.
        name: String,
        /// The MessagePack error (never the body).
        #[source]
        source: crate::BoxError,
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
    /// The body's [`BODY_ENCODING_HEADER`](crate::BODY_ENCODING_HEADER) is unknown, or the body does not decode with it.
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
