//! Encoding an envelope to its wire form: the body and the headers (a map, or one JSON object).

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::raw::{
    RAW_HEADERS_BASE64_HEADER, RAW_HEADERS_HEADER, RawParts, base64_body, base64_encode,
};
use super::{
    BASE64_ENCODING, BODY_ENCODING_HEADER, CONTENT_TYPE_HEADER, EncodeError, Encoded,
    JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE, STAMP_HEADER_PREFIX, Serializer, TYPE_HEADER,
};
use crate::Envelope;
use crate::envelope::Payload;
use crate::envelope::Slot;

/// Encodes an envelope (see [`MessageRegistry::encode`](crate::MessageRegistry::encode)); needs no registry.
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode(envelope: &Envelope) -> Result<Encoded, EncodeError> {
    encode_with(envelope, Serializer::Json)
}

/// [`encode`] with the body written by `serializer` (see [`Serializer`]).
///
/// ```
/// # use courier_core::{Envelope, Message, MessageRegistry, Serializer, encode_with};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping { n: u8 }
/// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
/// let wire = encode_with(&Envelope::new(Ping { n: 7 }), Serializer::MessagePack).unwrap();
/// assert_eq!(wire.headers["content-type"], "application/msgpack");
/// let back = MessageRegistry::new().with::<Ping>().decode(wire);
/// assert_eq!(back.message::<Ping>().map(|p| p.n), Some(7));
/// ```
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode_with(envelope: &Envelope, serializer: Serializer) -> Result<Encoded, EncodeError> {
    let msgpack = is_msgpack(envelope, serializer);
    let mut body = String::new();
    write_body(envelope, msgpack, &mut body)?;
    Ok(Encoded {
        body,
        headers: header_list(envelope, msgpack)?
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
/// header map [`encode`] builds; [`MessageRegistry::decode_json`](crate::MessageRegistry::decode_json) reads it back.
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
    encode_json_into_with(envelope, Serializer::Json, out)
}

/// [`encode_json`] with the body written by `serializer` (see [`Serializer`]).
///
/// # Errors
/// [`EncodeError`] if the message does not serialize.
pub fn encode_json_with(
    envelope: &Envelope,
    serializer: Serializer,
) -> Result<EncodedJson, EncodeError> {
    let mut out = EncodedJson::default();
    encode_json_into_with(envelope, serializer, &mut out)?;
    Ok(out)
}

/// [`encode_json_into`] with the body written by `serializer` (see [`Serializer`]).
///
/// # Errors
/// [`EncodeError`] if the message does not serialize; `out` then holds no usable text.
pub fn encode_json_into_with(
    envelope: &Envelope,
    serializer: Serializer,
    out: &mut EncodedJson,
) -> Result<(), EncodeError> {
    out.body.clear();
    out.headers.clear();
    let msgpack = is_msgpack(envelope, serializer);
    write_body(envelope, msgpack, &mut out.body)?;
    let plain = !msgpack
        && envelope.extra_headers.is_none()
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
    let headers = header_list(envelope, msgpack)?;
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

/// Whether the body is written as MessagePack: asked for, and the message is not carrying the
/// JSON text it was read with (kept verbatim) or undecodable.
fn is_msgpack(envelope: &Envelope, serializer: Serializer) -> bool {
    serializer == Serializer::MessagePack
        && matches!(envelope.payload, Payload::Typed { body: None, .. })
}

/// Appends the message's JSON text: the text it was read with, or the message serialized
/// (as base64 MessagePack when `msgpack`).
fn write_body(envelope: &Envelope, msgpack: bool, out: &mut String) -> Result<(), EncodeError> {
    match &envelope.payload {
        Payload::Typed {
            name,
            message,
            body: None,
        } if msgpack => {
            let mut bytes = Vec::with_capacity(128);
            message
                .encode_msgpack_into(&mut bytes)
                .map_err(|e| EncodeError {
                    name: (*name).to_owned(),
                    source: <serde_json::Error as serde::ser::Error>::custom(format_args!(
                        "MessagePack: {e}"
                    )),
                })?;
            base64_encode(&bytes, out);
            Ok(())
        }
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
fn header_list(envelope: &Envelope, msgpack: bool) -> Result<Headers<'_>, EncodeError> {
    let name = payload_name(envelope);
    let extra = envelope.extra_headers.as_deref();
    let mut headers: Headers<'_> = Vec::with_capacity(4 + extra.map_or(0, BTreeMap::len));
    if let Some(name) = name {
        headers.push((("", TYPE_HEADER), Cow::Borrowed(name)));
    }
    match &envelope.payload {
        Payload::Typed { .. } if msgpack => {
            headers.push((
                ("", CONTENT_TYPE_HEADER),
                Cow::Borrowed(MSGPACK_CONTENT_TYPE),
            ));
            headers.push((("", BODY_ENCODING_HEADER), Cow::Borrowed(BASE64_ENCODING)));
        }
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
pub(super) fn write_object<'a>(
    out: &mut String,
    headers: impl Iterator<Item = (HeaderKey<'a>, &'a str)>,
) {
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

/// The headers an undecodable message was read with that a typed envelope does not carry:
/// its own `content-type`, stamp headers that did not parse, its body encoding, or headers
/// that could not be read at all. Pushed before the stamps, so they win over them: a stamp
/// header that did not parse stays as it was (it is why the message does not decode), even
/// over stamps of its kind added since.
fn push_raw_headers<'e>(headers: &mut Headers<'e>, body: &[u8], raw: &'e RawParts) {
    if let Some(bytes) = &raw.unreadable_headers {
        match std::str::from_utf8(bytes) {
            Ok(text) => headers.push((("", RAW_HEADERS_HEADER), Cow::Borrowed(text))),
            Err(_) => {
                let mut text = String::new();
                base64_encode(bytes, &mut text);
                headers.push((("", RAW_HEADERS_BASE64_HEADER), Cow::Owned(text)));
            }
        }
    }
    if let Some(c) = &raw.content_type {
        headers.push((("", CONTENT_TYPE_HEADER), Cow::Borrowed(c)));
    }
    match &raw.body_encoding {
        Some(e) => headers.push((("", BODY_ENCODING_HEADER), Cow::Borrowed(e))),
        None if base64_body(body, raw) => {
            headers.push((("", BODY_ENCODING_HEADER), Cow::Borrowed(BASE64_ENCODING)));
        }
        None => {}
    }
    for (name, value) in &raw.bad_stamp_headers {
        headers.push((("", name), Cow::Borrowed(value)));
    }
}
