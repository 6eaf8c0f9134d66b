//! The `message` field of Symfony's Redis transport: JSON `{"body": ..., "headers": {...}}`,
//! wrapped by phpredis's PHP serializer (`s:<len>:"<json>";`, its default) unless PHP's DSN says
//! `serializer=0`. [`read()`] detects both; [`write()`] writes either. A delayed message waits
//! in the sorted set `<stream>__queue` as a [`queue_member()`] instead.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::php_json::{push_php_object, push_php_string};
use crate::php_serialize::{PhpSerializeError, PhpValue, unserialize};
use crate::serializer::SymfonyEncoded;

/// Why a Redis `message` field could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisFieldError {
    /// It looked PHP-serialized (`s:`) but is not a PHP string.
    #[error("message field is not a PHP-serialized string")]
    PhpSerialized(#[source] PhpSerializeError),
    /// It is not the JSON object `{"body": "...", "headers": {...}}`.
    #[error("message field is not Symfony's JSON object of body and headers")]
    Json(#[source] serde_json::Error),
}

#[derive(Deserialize)]
struct Field<'a> {
    body: String,
    #[serde(borrow)]
    headers: &'a RawValue,
}

/// Reads a `message` field into the body and the headers' JSON text (an object, or `[]`).
///
/// # Errors
/// [`RedisFieldError`] when the field is neither form.
pub fn read(field: &[u8]) -> Result<(String, String), RedisFieldError> {
    read_parts(field).map(|(body, headers)| (body, headers.into_owned()))
}

/// [`read`], the headers' text borrowed from the field where it can be.
pub(crate) fn read_parts(field: &[u8]) -> Result<(String, Cow<'_, str>), RedisFieldError> {
    fn parse(json: &[u8]) -> Result<(String, &str), RedisFieldError> {
        let parsed: Field<'_> = serde_json::from_slice(json).map_err(RedisFieldError::Json)?;
        Ok((parsed.body, parsed.headers.get()))
    }
    match php_string(field) {
        Some(json) => parse(json).map(|(body, headers)| (body, Cow::Borrowed(headers))),
        // Not the PHP string it looks like: PHP's reader names what is wrong.
        None if field.starts_with(b"s:") => {
            let PhpValue::Str(json) = unserialize(field).map_err(RedisFieldError::PhpSerialized)?
            else {
                return Err(RedisFieldError::PhpSerialized(PhpSerializeError {
                    offset: 0,
                    reason: "a string",
                }));
            };
            parse(&json).map(|(body, headers)| (body, Cow::Owned(headers.to_owned())))
        }
        None => parse(field).map(|(body, headers)| (body, Cow::Borrowed(headers))),
    }
}

/// The bytes of phpredis's `s:<len>:"<bytes>";`, when the field is exactly that.
fn php_string(field: &[u8]) -> Option<&[u8]> {
    let rest = field.strip_prefix(b"s:")?;
    let colon = rest.iter().position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
    let quoted = rest.get(colon + 1..)?.strip_prefix(b"\"")?;
    let (bytes, tail) = (quoted.get(..len)?, quoted.get(len..)?);
    (tail == b"\";").then_some(bytes)
}

/// Writes a `message` field as Symfony's Redis transport does: PHP-serialized when
/// `php_serialized` (phpredis's default), plain JSON otherwise.
#[must_use]
pub fn write(encoded: &SymfonyEncoded, php_serialized: bool) -> String {
    write_parts(
        &encoded.body,
        encoded
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
        php_serialized,
    )
}

/// [`write`] of a body and headers.
pub(crate) fn write_parts<'a>(
    body: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    php_serialized: bool,
) -> String {
    let mut json = String::new();
    write_json(&mut json, body, headers);
    if php_serialized {
        format!("s:{}:\"{json}\";", json.len())
    } else {
        json
    }
}

/// Writes the JSON of a `message` field (`{"body": ..., "headers": {...}}`) into `json`,
/// cleared first: a transport keeps one buffer for a batch.
pub(crate) fn write_json<'a>(
    json: &mut String,
    body: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    json.clear();
    json.reserve(body.len() * 5 / 4 + 256);
    body_and_headers_into(json, body, headers);
    json.push('}');
}

/// A `message` field as a command's argument, written straight into the command: the JSON of
/// [`write_json`], wrapped as phpredis's PHP string when `php_serialized`.
#[cfg(feature = "redis")]
pub(crate) struct FieldArg<'a> {
    pub(crate) json: &'a str,
    pub(crate) php_serialized: bool,
}

#[cfg(feature = "redis")]
impl FieldArg<'_> {
    /// The field's length in bytes, at most.
    pub(crate) fn len(&self) -> usize {
        if self.php_serialized {
            // `s:`, up to 20 digits, `:"`, the JSON, `";`.
            self.json.len() + 26
        } else {
            self.json.len()
        }
    }
}

#[cfg(feature = "redis")]
impl redis::ToRedisArgs for FieldArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writing to a command's buffer cannot fail (it grows a `Vec`).
        if self.php_serialized {
            let _ = write!(arg, "s:{}:\"", self.json.len());
            let _ = arg.write_all(self.json.as_bytes());
            let _ = arg.write_all(b"\";");
        } else {
            let _ = arg.write_all(self.json.as_bytes());
        }
    }
}

/// `{"body": ..., "headers": {...}` (the object left open), in one buffer, as PHP writes it.
fn body_and_headers<'a>(
    body: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut json = String::with_capacity(body.len() * 5 / 4 + 256);
    body_and_headers_into(&mut json, body, headers);
    json
}

/// [`body_and_headers`], appended to `json`.
fn body_and_headers_into<'a>(
    json: &mut String,
    body: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    json.push_str("{\"body\":");
    push_php_string(json, body);
    json.push_str(",\"headers\":");
    push_php_object(json, headers);
}

/// A delayed message's member of the sorted set `<stream>__queue`, as Symfony's Redis transport
/// writes it: JSON `{"body": ..., "headers": {...}, "uniqid": "..."}`, never through phpredis's
/// serializer (`uniqid` keeps equal messages apart in the set; PHP's is `uniqid('', true)`).
#[must_use]
pub fn queue_member(encoded: &SymfonyEncoded, uniqid: &str) -> String {
    let mut json = body_and_headers(
        &encoded.body,
        encoded
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    json.push_str(",\"uniqid\":");
    push_php_string(&mut json, uniqid);
    json.push('}');
    json
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_php_string_is_read_in_place_only_when_its_length_and_end_are_right() {
        assert_eq!(php_string(b"s:4:\"h\xc3\xa9l\";"), Some(&b"h\xc3\xa9l"[..]));
        assert_eq!(php_string(b"s:2:\"\";\";"), Some(&b"\";"[..]));
        for bad in [
            &b"s:6:\"hello\";"[..],
            b"s:4:\"hello\";",
            b"s:5:\"hello\"",
            b"s:x:\"hello\";",
            b"s:5\"hello\";",
        ] {
            assert_eq!(php_string(bad), None, "{}", String::from_utf8_lossy(bad));
            assert!(
                matches!(read(bad), Err(RedisFieldError::PhpSerialized(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn both_forms_read_back_what_was_written() {
        let encoded = SymfonyEncoded {
            body: r#"{"to":"a\"b","n":1}"#.to_owned(),
            headers: vec![
                ("type".to_owned(), r"App\Ping".to_owned()),
                ("Content-Type".to_owned(), "application/json".to_owned()),
            ],
        };
        let headers = r#"{"type":"App\\Ping","Content-Type":"application\/json"}"#;
        for php in [true, false] {
            let (body, read_headers) = read(write(&encoded, php).as_bytes()).expect("reads");
            assert_eq!(
                (body.as_str(), read_headers.as_str()),
                (encoded.body.as_str(), headers)
            );
        }
    }
}
