//! The body serializer a transport writes with: JSON (the default, language-neutral) or
//! MessagePack (compact binary).

use std::fmt;
use std::str::FromStr;

/// How a transport writes message bodies (the DSN option or config key `serializer`).
///
/// Reading never depends on it: a consumer decodes each message by its `content-type`, so a
/// queue may hold JSON and MessagePack messages side by side.
///
/// - `json` (default): the body is the message as JSON, `content-type: application/json`.
/// - `msgpack`: the body is the message as a MessagePack map (field names kept, so it evolves
///   like JSON), `content-type: application/msgpack`. Bodies are text on every transport
///   (SQL `TEXT` columns, Redis fields, AMQP bodies), so it travels as base64 under
///   `x-courier-body-encoding: base64`; a raw binary MessagePack body (an AMQP producer in
///   another language) decodes too. A message that keeps the JSON text it was read with (a
///   retried JSON message) is written back as that JSON.
///
/// ```
/// use courier_core::Serializer;
/// assert_eq!("msgpack".parse::<Serializer>(), Ok(Serializer::MessagePack));
/// assert_eq!(Serializer::default(), Serializer::Json);
/// assert!("xml".parse::<Serializer>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Serializer {
    /// JSON bodies (the default).
    #[default]
    Json,
    /// MessagePack bodies.
    MessagePack,
}

impl Serializer {
    /// The option value: `json` or `msgpack`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::MessagePack => "msgpack",
        }
    }
}

impl fmt::Display for Serializer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `serializer` value that names no serializer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown serializer `{0}` (expected json or msgpack)")]
pub struct UnknownSerializer(pub String);

impl FromStr for Serializer {
    type Err = UnknownSerializer;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(Self::Json),
            "msgpack" | "messagepack" => Ok(Self::MessagePack),
            other => Err(UnknownSerializer(other.to_owned())),
        }
    }
}
