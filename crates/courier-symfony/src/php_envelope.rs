//! Messenger's `PhpSerializer` envelopes (`addslashes(serialize($envelope))`, base64 when not
//! UTF-8) read into Symfony's JSON form: the message's class, its properties as a JSON body, and
//! one `X-Message-Stamp-<class>` JSON list per stamp class.

use std::str::FromStr;

use chrono::{NaiveDateTime, SecondsFormat, TimeZone};
use chrono_tz::Tz;
use serde_json::{Map, Value};

use crate::php_serialize::{
    PhpKey, PhpSerializeError, PhpValue, base64_decode, prop_name, stripslashes, unserialize,
};
use crate::stamps::SYMFONY_STAMP_PREFIX;

const ENVELOPE_CLASS: &str = r"Symfony\Component\Messenger\Envelope";

/// A `PhpSerializer` envelope in Symfony's JSON form.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PhpEnvelope {
    /// The message's PHP class.
    pub(crate) class: String,
    /// The message's properties as JSON (PHP's names, visibility prefixes dropped).
    pub(crate) body: String,
    /// `X-Message-Stamp-<class>` headers, each a JSON list of the stamps' properties.
    pub(crate) stamp_headers: Vec<(String, String)>,
}

/// Whether a body looks like a `PhpSerializer` envelope (as stored, or base64 of it).
pub(crate) fn looks_like_php_envelope(body: &str) -> bool {
    body.starts_with(r#"O:36:\"Symfony"#) || body.starts_with("TzozNjpc")
}

/// Reads a `PhpSerializer` body.
pub(crate) fn read(body: &str) -> Result<PhpEnvelope, PhpSerializeError> {
    let bytes = if body.ends_with('}') {
        body.as_bytes().to_vec()
    } else {
        base64_decode(body).ok_or(PhpSerializeError {
            offset: 0,
            reason: "a base64 body (a PhpSerializer body not ending in `}`)",
        })?
    };
    let envelope = unserialize(&stripslashes(&bytes))?;
    let not_envelope = PhpSerializeError {
        offset: 0,
        reason: r"a Symfony\Component\Messenger\Envelope object",
    };
    match &envelope {
        PhpValue::Object { class, .. } if class == ENVELOPE_CLASS => {}
        _ => return Err(not_envelope),
    }
    let message = envelope.prop("message").ok_or(not_envelope.clone())?;
    let PhpValue::Object { class, .. } = message else {
        return Err(not_envelope);
    };
    let mut stamp_headers = Vec::new();
    if let Some(PhpValue::Array(by_class)) = envelope.prop("stamps") {
        for (key, stamps) in by_class {
            let (PhpKey::Str(stamp_class), PhpValue::Array(stamps)) = (key, stamps) else {
                continue;
            };
            let list: Vec<Value> = stamps.iter().map(|(_, s)| to_json(s)).collect();
            stamp_headers.push((
                format!(
                    "{SYMFONY_STAMP_PREFIX}{}",
                    String::from_utf8_lossy(stamp_class)
                ),
                Value::Array(list).to_string(),
            ));
        }
    }
    Ok(PhpEnvelope {
        class: class.clone(),
        body: to_json(message).to_string(),
        stamp_headers,
    })
}

/// A PHP value as Symfony's serializer would normalize it, as far as the serialized form tells:
/// objects as their properties, `DateTime`s as RFC 3339 text, enums as their case name (the
/// serialized form does not hold a backed enum's value), lists as arrays.
fn to_json(value: &PhpValue) -> Value {
    match value {
        PhpValue::Null => Value::Null,
        PhpValue::Bool(b) => Value::Bool(*b),
        PhpValue::Int(i) => Value::from(*i),
        PhpValue::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        PhpValue::Str(s) => Value::String(String::from_utf8_lossy(s).into_owned()),
        PhpValue::Enum { case, .. } => Value::String(case.clone()),
        PhpValue::Array(items) => {
            let is_list = items
                .iter()
                .enumerate()
                .all(|(i, (k, _))| *k == PhpKey::Int(i as i64));
            if is_list {
                Value::Array(items.iter().map(|(_, v)| to_json(v)).collect())
            } else {
                let map: Map<String, Value> = items
                    .iter()
                    .map(|(k, v)| {
                        let key = match k {
                            PhpKey::Int(i) => i.to_string(),
                            PhpKey::Str(s) => String::from_utf8_lossy(s).into_owned(),
                        };
                        (key, to_json(v))
                    })
                    .collect();
                Value::Object(map)
            }
        }
        PhpValue::Object { class, props } => {
            if let Some(text) = datetime(class, value) {
                return Value::String(text);
            }
            Value::Object(
                props
                    .iter()
                    .map(|(name, v)| {
                        (
                            String::from_utf8_lossy(prop_name(name)).into_owned(),
                            to_json(v),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// A serialized `DateTime` / `DateTimeImmutable` as `Y-m-d\TH:i:sP`.
fn datetime(class: &str, value: &PhpValue) -> Option<String> {
    if class != "DateTime" && class != "DateTimeImmutable" {
        return None;
    }
    let PhpValue::Str(date) = value.prop("date")? else {
        return None;
    };
    let PhpValue::Str(zone) = value.prop("timezone")? else {
        return None;
    };
    let naive =
        NaiveDateTime::parse_from_str(std::str::from_utf8(date).ok()?, "%Y-%m-%d %H:%M:%S%.f")
            .ok()?;
    let zone = std::str::from_utf8(zone).ok()?;
    let fixed = if let Ok(tz) = Tz::from_str(zone) {
        tz.from_local_datetime(&naive).earliest()?.fixed_offset()
    } else {
        let offset = chrono::FixedOffset::from_str(zone).ok()?;
        offset.from_local_datetime(&naive).single()?
    };
    Some(fixed.to_rfc3339_opts(SecondsFormat::Secs, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datetime_keeps_its_zone_offset() {
        let obj = |zone: &str| PhpValue::Object {
            class: "DateTimeImmutable".into(),
            props: vec![
                (
                    b"date".to_vec(),
                    PhpValue::Str(b"2024-05-06 07:08:09.000000".to_vec()),
                ),
                (b"timezone_type".to_vec(), PhpValue::Int(3)),
                (
                    b"timezone".to_vec(),
                    PhpValue::Str(zone.as_bytes().to_vec()),
                ),
            ],
        };
        assert_eq!(
            to_json(&obj("Europe/Paris")),
            Value::from("2024-05-06T07:08:09+02:00")
        );
        assert_eq!(
            to_json(&obj("UTC")),
            Value::from("2024-05-06T07:08:09+00:00")
        );
        assert_eq!(
            to_json(&obj("-05:00")),
            Value::from("2024-05-06T07:08:09-05:00")
        );
    }

    #[test]
    fn a_body_that_is_not_an_envelope_is_refused() {
        assert!(read(r#"O:8:\"stdClass\":0:{}"#).is_err());
        assert!(read("not base64 at all!").is_err());
    }
}
