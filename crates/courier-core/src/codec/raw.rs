//! What an undecodable message keeps of its wire form, so that moving it to another transport
//! (the failure transport) and back gives the same message: the same body bytes, the same
//! headers, and the same reason not to decode.
//!
//! Bodies are text on every transport Courier writes; a body that is not UTF-8 travels as
//! base64 with the header [`BODY_ENCODING_HEADER`]` = base64` (read back as the original bytes).
//! Headers that were not a JSON object of strings travel verbatim in the header
//! [`RAW_HEADERS_HEADER`] (or, when not UTF-8, as base64 in [`RAW_HEADERS_BASE64_HEADER`]); such
//! a message has no `type` header, so it stays undecodable wherever it goes.

use std::borrow::Cow;

use super::{JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE};

/// The header saying how the body is encoded on the wire; the only value Courier knows is
/// `base64` (the body's bytes are not UTF-8 text).
pub const BODY_ENCODING_HEADER: &str = "x-courier-body-encoding";
/// The value of [`BODY_ENCODING_HEADER`] for a base64 body.
pub const BASE64_ENCODING: &str = "base64";
/// The header holding, verbatim, headers that could not be read as a JSON object of strings.
pub const RAW_HEADERS_HEADER: &str = "x-courier-raw-headers";
/// As [`RAW_HEADERS_HEADER`], base64, for headers that were not even UTF-8 text.
pub const RAW_HEADERS_BASE64_HEADER: &str = "x-courier-raw-headers-base64";

/// The parts of an undecodable message's headers that a typed envelope does not keep.
#[derive(Debug, Default)]
pub(crate) struct RawParts {
    /// The `content-type` header as read (absent stays absent).
    pub(crate) content_type: Option<String>,
    /// Stamp headers whose value is not a JSON list, verbatim (name, value).
    pub(crate) bad_stamp_headers: Vec<(String, String)>,
    /// The [`BODY_ENCODING_HEADER`] as read.
    pub(crate) body_encoding: Option<String>,
    /// Headers that could not be read as a JSON object of strings, as stored.
    pub(crate) unreadable_headers: Option<Box<[u8]>>,
}

/// The `content-type` a decodable message came with, kept without allocating in the usual
/// cases.
#[derive(Clone)]
pub(super) enum ContentType {
    Absent,
    Json,
    MessagePack,
    Other(String),
}

impl ContentType {
    pub(super) fn new(found: Option<Cow<'_, str>>) -> Self {
        match found {
            None => Self::Absent,
            Some(c) if c == JSON_CONTENT_TYPE => Self::Json,
            Some(c) if c == MSGPACK_CONTENT_TYPE => Self::MessagePack,
            Some(c) => Self::Other(c.into_owned()),
        }
    }

    pub(super) fn header(&self) -> Option<String> {
        match self {
            Self::Absent => None,
            Self::Json => Some(JSON_CONTENT_TYPE.to_owned()),
            Self::MessagePack => Some(MSGPACK_CONTENT_TYPE.to_owned()),
            Self::Other(c) => Some(c.clone()),
        }
    }
}

/// Whether an undecodable body goes on the wire as base64: when its bytes are not UTF-8 (and
/// the body is not the wire text of an encoding that did not decode, kept verbatim).
pub(super) fn base64_body(body: &[u8], raw: &RawParts) -> bool {
    raw.body_encoding.is_none() && std::str::from_utf8(body).is_err()
}

/// Standard base64, padded when written, padding optional when read.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Standard base64 with padding, appended to `out`.
pub(crate) fn base64_encode(bytes: &[u8], out: &mut String) {
    base64::Engine::encode_string(&BASE64, bytes, out);
}

/// Decodes standard base64 (padding optional, no whitespace); `None` if it is not base64.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    base64::Engine::decode(&BASE64, text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_tail_length() {
        for len in 0..40usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 200) as u8).collect();
            let mut text = String::new();
            base64_encode(&bytes, &mut text);
            assert_eq!(text.len() % 4, 0);
            assert_eq!(base64_decode(&text), Some(bytes), "{text}");
        }
        let mut text = String::new();
        base64_encode(b"\xff\xfe hello", &mut text);
        assert_eq!(text, "//4gaGVsbG8=");
        assert_eq!(base64_decode("not base64!"), None);
        assert_eq!(base64_decode("A"), None);
    }
}
