//! Reading stream entries out of Redis replies (`XREADGROUP`, `XRANGE` and the claim scripts).

use redis::Value;

/// One stream entry as read: id, body bytes (empty when missing), headers bytes (JSON text;
/// `None` when missing), delivery count (1 for a first delivery). Body and headers are kept as
/// the bytes stored, UTF-8 or not, so an entry no producer should write still decodes to an
/// undecodable envelope that keeps them.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) count: u64,
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Like [`text`], taking the reply's bytes without copying them when they are valid UTF-8.
pub(crate) fn into_text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(
            String::from_utf8(b)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
        Value::SimpleString(s) => Some(s),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

/// A field's bytes as stored.
fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn into_items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    }
}

/// Whether a field name is `name` (compared as bytes, without allocating).
fn is(field: &Value, name: &str) -> bool {
    match field {
        Value::BulkString(b) => b == name.as_bytes(),
        Value::SimpleString(s) => s == name,
        _ => false,
    }
}

/// The body and headers JSON in an entry's fields, as bytes. A missing body reads as empty,
/// missing headers as `None`, which
/// [`JsonDecoder::decode_bytes`](courier_core::JsonDecoder::decode_bytes) turns into a decode
/// error.
pub(crate) fn fields(fields: Value) -> (Vec<u8>, Option<Vec<u8>>) {
    let (mut body, mut headers) = (Vec::new(), None);
    let mut set = |k: &Value, v: Value| {
        if is(k, "body") {
            body = into_bytes(v).unwrap_or_default();
        } else if is(k, "headers") {
            headers = into_bytes(v);
        }
    };
    match fields {
        Value::Map(pairs) => pairs.into_iter().for_each(|(k, v)| set(&k, v)),
        other => {
            let mut items = into_items(other).into_iter();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                set(&k, v);
            }
        }
    }
    (body, headers)
}

/// `[id, fields]` or `[id, fields, count]`; `None` for a deleted entry (nil fields).
fn entry(v: Value) -> Option<Entry> {
    let mut parts = into_items(v).into_iter();
    let id = into_text(parts.next()?)?;
    let fields = parts.next()?;
    if matches!(fields, Value::Nil) {
        return None;
    }
    let count = parts
        .next()
        .as_ref()
        .and_then(int)
        .and_then(|c| u64::try_from(c).ok())
        .unwrap_or(1);
    let (body, headers) = self::fields(fields);
    Some(Entry {
        id,
        body,
        headers,
        count,
    })
}

/// A list of entries (`XRANGE`, the recover script).
pub(crate) fn entries(v: Value) -> Vec<Entry> {
    into_items(v).into_iter().filter_map(entry).collect()
}

/// An `XREADGROUP` reply for one stream: nil, `[[key, entries]]` or a RESP3 map.
pub(crate) fn read_reply(v: Value) -> Vec<Entry> {
    match v {
        Value::Map(pairs) => pairs
            .into_iter()
            .next()
            .map(|(_, e)| entries(e))
            .unwrap_or_default(),
        other => into_items(other)
            .into_iter()
            .next()
            .and_then(|s| into_items(s).into_iter().nth(1))
            .map(entries)
            .unwrap_or_default(),
    }
}

/// The claim script's `{cursor, entries}`.
pub(crate) fn claim_reply(v: Value) -> (String, Vec<Entry>) {
    let mut parts = into_items(v).into_iter();
    let cursor = parts
        .next()
        .and_then(into_text)
        .unwrap_or_else(|| "0-0".to_owned());
    (cursor, parts.next().map(entries).unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn reads_an_xreadgroup_reply_and_skips_deleted_entries() {
        let fields = Value::Array(vec![
            bulk("body"),
            bulk("{\"a\":1}"),
            bulk("headers"),
            bulk("{\"type\":\"t\"}"),
        ]);
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![
                Value::Array(vec![bulk("1-0"), fields]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let got = read_reply(reply);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id, "1-0");
        assert_eq!(got[0].count, 1);
        assert_eq!(got[0].body, b"{\"a\":1}");
        assert_eq!(got[0].headers.as_deref(), Some(&b"{\"type\":\"t\"}"[..]));
        assert!(read_reply(Value::Nil).is_empty());
    }

    #[test]
    fn fields_are_read_in_any_order_and_missing_ones_are_empty() {
        let f = Value::Array(vec![
            bulk("headers"),
            bulk("not json"),
            bulk("body"),
            bulk("x"),
        ]);
        assert_eq!(fields(f), (b"x".to_vec(), Some(b"not json".to_vec())));
        let f = Value::Map(vec![(
            Value::SimpleString("body".into()),
            Value::BulkString(vec![0xff, b'y']),
        )]);
        assert_eq!(fields(f), (vec![0xff, b'y'], None));
    }

    #[test]
    fn reads_claimed_entries_with_their_delivery_count() {
        let fields = Value::Array(vec![bulk("body"), bulk("b"), bulk("headers"), bulk("{}")]);
        let reply = Value::Array(vec![
            bulk("5-0"),
            Value::Array(vec![Value::Array(vec![bulk("3-0"), fields, Value::Int(2)])]),
        ]);
        let (cursor, got) = claim_reply(reply);
        assert_eq!(cursor, "5-0");
        assert_eq!((got[0].id.as_str(), got[0].count), ("3-0", 2));
    }
}
