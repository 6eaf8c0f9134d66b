//! The `message` field of Symfony's Redis transport: JSON `{"body": ..., "headers": {...}}`,
//! wrapped by phpredis's PHP serializer (`s:<len>:"<json>";`, its default) unless PHP's DSN says
//! `serializer=0`. [`read()`] detects both; [`write()`] writes either. A delayed message waits
//! in the sorted set `<stream>__queue` as a [`queue_member()`] instead.

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
    let unwrapped;
    let json: &[u8] = if field.starts_with(b"s:") {
        match unserialize(field).map_err(RedisFieldError::PhpSerialized)? {
            PhpValue::Str(bytes) => {
                unwrapped = bytes;
                &unwrapped
            }
            _ => {
                return Err(RedisFieldError::PhpSerialized(PhpSerializeError {
                    offset: 0,
                    reason: "a string",
                }));
            }
        }
    } else {
        field
    };
    let parsed: Field<'_> = serde_json::from_slice(json).map_err(RedisFieldError::Json)?;
    Ok((parsed.body, parsed.headers.get().to_owned()))
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
    let mut json = body_and_headers(body, headers);
    json.push('}');
    if php_serialized {
        format!("s:{}:\"{json}\";", json.len())
    } else {
        json
    }
}

/// `{"body": ..., "headers": {...}` (the object left open), in one buffer, as PHP writes it.
fn body_and_headers<'a>(
    body: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut json = String::with_capacity(body.len() * 5 / 4 + 160);
    json.push_str("{\"body\":");
    push_php_string(&mut json, body);
    json.push_str(",\"headers\":");
    push_php_object(&mut json, headers);
    json
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
