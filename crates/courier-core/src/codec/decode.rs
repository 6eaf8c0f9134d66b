//! Decoding headers into the parts of an envelope: the type, the stamps, the extra headers,
//! or why the message is undecodable.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::value::RawValue;

use super::raw::{ContentType, RawParts, base64_decode};
use super::{
    BASE64_ENCODING, BODY_ENCODING_HEADER, CONTENT_TYPE_HEADER, DecodeError, DecodeFn, Decoders,
    JSON_CONTENT_TYPE, MSGPACK_CONTENT_TYPE, STAMP_HEADER_PREFIX, TYPE_HEADER,
};
use crate::Envelope;
use crate::envelope::Payload;
use crate::envelope::{RawSlot, Slot};

/// Headers that name a registered type and carry well-formed stamps: all that is left to do for
/// a message is to decode its body.
pub(super) struct Prepared {
    name: &'static str,
    decode: DecodeFn,
    stamps: Vec<Slot>,
    extra_headers: Option<Arc<BTreeMap<String, String>>>,
    content_type: ContentType,
    /// The body is base64 ([`BODY_ENCODING_HEADER`]).
    base64: bool,
}

impl Prepared {
    pub(super) fn envelope(&self, body: String) -> Envelope {
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

    pub(super) fn finish(
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
        if matches!(parts.content_type, ContentType::MessagePack) {
            let bytes = if parts.base64 {
                match base64_decode(&body) {
                    Some(bytes) => bytes,
                    None => {
                        return Envelope {
                            payload: undecodable(
                                body.into_bytes(),
                                DecodeError::InvalidBodyEncoding {
                                    encoding: BASE64_ENCODING.to_owned(),
                                },
                                Some(BASE64_ENCODING.to_owned()),
                            ),
                            stamps,
                            extra_headers,
                        };
                    }
                }
            } else {
                body.into_bytes()
            };
            return Self::finish_msgpack(parts, stamps, extra_headers, bytes);
        }
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
            Ok(body) => match (parts.decode.json)(&body) {
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

impl Prepared {
    /// Whether bodies are raw MessagePack bytes (no base64 on the wire).
    pub(super) fn raw_msgpack(&self) -> bool {
        matches!(self.content_type, ContentType::MessagePack) && !self.base64
    }

    /// The envelope of a MessagePack body given as its bytes.
    pub(super) fn finish_msgpack(
        parts: Parts<'_>,
        stamps: Vec<Slot>,
        extra_headers: Option<Arc<BTreeMap<String, String>>>,
        bytes: Vec<u8>,
    ) -> Envelope {
        let payload = match (parts.decode.msgpack)(&bytes) {
            Ok(message) => Payload::Typed {
                name: parts.name,
                message,
                body: None,
            },
            Err(e) => Payload::Undecodable {
                name: Some(Arc::from(parts.name)),
                body: Arc::from(bytes),
                error: Arc::new(DecodeError::InvalidMsgpackBody {
                    name: parts.name.to_owned(),
                    source: Box::new(e),
                }),
                raw: Arc::new(RawParts {
                    content_type: parts.content_type.header(),
                    ..RawParts::default()
                }),
            },
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
pub(super) struct Parts<'p> {
    name: &'static str,
    decode: DecodeFn,
    content_type: &'p ContentType,
    base64: bool,
}

/// Headers that do not name a usable type: every message carrying them is undecodable.
pub(super) struct Rejected {
    name: Option<String>,
    error: DecodeError,
    stamps: Vec<Slot>,
    extra_headers: Option<Arc<BTreeMap<String, String>>>,
    raw: Box<RawParts>,
}

impl Rejected {
    pub(super) fn envelope(mut self, body: Vec<u8>) -> Envelope {
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

/// Reads a headers object pair by pair into what `make` gives (sized for the pairs announced),
/// with `push`, borrowing every string without escapes.
pub(super) struct PairVisitor<M, P> {
    pub(super) make: M,
    pub(super) push: P,
}

impl<'de, T, M, P> serde::de::Visitor<'de> for PairVisitor<M, P>
where
    M: FnOnce(usize) -> T,
    P: FnMut(&mut T, Cow<'de, str>, Cow<'de, str>),
{
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of string values")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut target = (self.make)(map.size_hint().unwrap_or(2));
        let mut push = self.push;
        while let Some((Text(k), Text(v))) = map.next_entry::<Text<'de>, Text<'de>>()? {
            push(&mut target, k, v);
        }
        Ok(target)
    }
}

/// Reads a headers object straight into a sink, borrowing every string without escapes.
impl<'de> serde::Deserialize<'de> for HeaderSink<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PairVisitor {
            make: HeaderSink::with_capacity,
            push: |sink: &mut HeaderSink<'de>, k, v| sink.push(k, v),
        })
    }
}

/// A header's name and value, each borrowed or owned.
pub type HeaderPair<'a> = (Cow<'a, str>, Cow<'a, str>);

/// A headers object (a JSON object of strings) as its pairs, in the text's order, each string
/// borrowed from the text where it holds no escape: for a format that renames headers before
/// they are decoded (with [`MessageRegistry::decode_pairs`](crate::MessageRegistry::decode_pairs)).
///
/// ```
/// let pairs = courier_core::header_pairs(r#"{"type":"app.ping","x-note":"a\"b"}"#).unwrap();
/// assert_eq!(pairs[0], ("type".into(), "app.ping".into()));
/// assert!(matches!(pairs[0].1, std::borrow::Cow::Borrowed(_)));
/// assert_eq!(pairs[1].1, "a\"b");
/// ```
///
/// # Errors
/// The JSON error when the text is not an object of strings.
pub fn header_pairs(json: &str) -> Result<Vec<HeaderPair<'_>>, serde_json::Error> {
    use serde::Deserializer as _;
    if let Some(pairs) = compact_pairs(json) {
        return Ok(pairs);
    }
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let pairs = (&mut deserializer).deserialize_map(PairVisitor {
        make: Vec::with_capacity,
        push: |pairs: &mut Vec<_>, k, v| pairs.push((k, v)),
    })?;
    deserializer.end()?;
    Ok(pairs)
}

/// The pairs of a headers object written as Courier's encoder writes it (compact, no escape in
/// any string), read in one pass over its bytes; `None` for any other text, which the JSON
/// parser then reads (or refuses). A symfony-format send reads back every message's headers:
/// the parser took a fifth of its encoding time.
pub(super) fn compact_pairs(json: &str) -> Option<Vec<HeaderPair<'_>>> {
    /// The string starting at `at` (a quote), up to its closing quote, without an escape or a
    /// control character (which JSON never holds unescaped); `at` moves past it.
    fn string<'a>(json: &'a str, at: &mut usize) -> Option<&'a str> {
        let bytes = json.as_bytes();
        if bytes.get(*at) != Some(&b'"') {
            return None;
        }
        let start = *at + 1;
        let len = bytes
            .get(start..)?
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if bytes[start + len] != b'"' {
            return None;
        }
        *at = start + len + 1;
        json.get(start..start + len)
    }
    let end = json.len().checked_sub(1)?;
    if !json.starts_with('{') || !json.ends_with('}') || end == 0 {
        return None;
    }
    let mut pairs = Vec::with_capacity(4);
    let mut at = 1;
    while at < end {
        if at > 1 {
            if json.as_bytes()[at] != b',' {
                return None;
            }
            at += 1;
        }
        let name = string(json, &mut at)?;
        if json.as_bytes().get(at) != Some(&b':') {
            return None;
        }
        at += 1;
        let value = string(json, &mut at)?;
        pairs.push((Cow::Borrowed(name), Cow::Borrowed(value)));
    }
    (at == end).then_some(pairs)
}

/// Sorts headers into the parts of an envelope, one header at a time; `type` and
/// `content-type` stay borrowed from the wire text where they can.
pub(super) struct HeaderSink<'a> {
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
    pub(super) fn with_capacity(headers: usize) -> Self {
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

    pub(super) fn push(&mut self, key: Cow<'_, str>, value: Cow<'a, str>) {
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

    pub(super) fn finish(self, decoders: &Decoders, body: String) -> Envelope {
        match self.prepare(decoders) {
            Ok(prepared) => prepared.into_envelope(body),
            Err(rejected) => rejected.envelope(body.into_bytes()),
        }
    }

    /// The envelope of a message whose body is not UTF-8: undecodable whatever its headers say.
    pub(super) fn finish_not_text(
        self,
        decoders: &Decoders,
        e: std::string::FromUtf8Error,
    ) -> Envelope {
        let error = DecodeError::BodyNotText {
            source: e.utf8_error(),
        };
        let body = e.into_bytes();
        match self.prepare(decoders) {
            Ok(p) if p.raw_msgpack() => {
                let parts = p.parts();
                Prepared::finish_msgpack(parts, p.stamps.clone(), p.extra_headers.clone(), body)
            }
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
    pub(super) fn prepare(self, decoders: &Decoders) -> Result<Prepared, Rejected> {
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
                if content_type.as_deref().is_some_and(|c| {
                    !c.starts_with(JSON_CONTENT_TYPE) && c != MSGPACK_CONTENT_TYPE
                }) =>
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
            (Some(n), None) => match decoders.get_key_value(&**n) {
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

/// An envelope for headers that are not a JSON object of strings: they are kept as stored.
pub(super) fn unreadable_headers(
    body: Vec<u8>,
    headers: &[u8],
    source: serde_json::Error,
) -> Envelope {
    Envelope {
        payload: Payload::Undecodable {
            name: None,
            body: Arc::from(body),
            error: Arc::new(DecodeError::InvalidHeaders { source }),
            raw: Arc::new(RawParts {
                unreadable_headers: Some(headers.into()),
                ..RawParts::default()
            }),
        },
        stamps: Vec::with_capacity(4),
        extra_headers: None,
    }
}
