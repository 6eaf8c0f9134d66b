//! What Symfony's Redis transport stores besides the `message` field: the members of the
//! delayed messages' sorted set `<stream>__queue`, the scripts that move them to the stream and
//! keep entries alive, and the reading of stream entries from Redis's replies.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use redis::{Script, Value};

use crate::SymfonyEncoded;

/// Moves the due members of `KEYS[1]` (`<stream>__queue`) to the stream `KEYS[2]`, at most
/// `ARGV[2]` of them due by `ARGV[1]` (ms): what PHP's `Connection::get` does with `ZPOPMIN`
/// and `add()`, in one step. PHP decodes the member and encodes `body` and `headers` again,
/// which gives the member's text without its trailing `,"uniqid":"..."`; written with
/// phpredis's PHP serializer (`s:<len>:"...";`) when `ARGV[3]` is `1`, with `MAXLEN ~ ARGV[4]`
/// unless it is `0`. A member without `uniqid` moves as it is.
const MOVE_DUE: &str = r#"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local moved = 0
for _, member in ipairs(due) do
  if redis.call('ZREM', KEYS[1], member) == 1 then
    local json = member
    local cut = nil
    local from = 1
    while true do
      local at = string.find(member, ',"uniqid":"', from, true)
      if not at then break end
      cut = at
      from = at + 1
    end
    if cut then json = string.sub(member, 1, cut - 1) .. '}' end
    if ARGV[3] == '1' then json = 's:' .. string.len(json) .. ':"' .. json .. '";' end
    if ARGV[4] ~= '0' then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'message', json)
    else
      redis.call('XADD', KEYS[2], '*', 'message', json)
    end
    moved = moved + 1
  end
end
return moved
"#;

/// Resets the idle time of the entries `ARGV[3..]` of stream `KEYS[1]` still pending for
/// consumer `ARGV[2]` of group `ARGV[1]` (`XCLAIM ... 0 <id> JUSTID`), so that no one claims
/// them (PHP claims an entry once it is idle `redeliver_timeout`). One another consumer
/// claimed meanwhile stays theirs. Returns how many were kept.
const KEEPALIVE: &str = r"
local kept = 0
for i = 3, #ARGV do
  local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #mine > 0 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept = kept + 1
  end
end
return kept
";

/// The transport's scripts.
pub(crate) struct Scripts {
    pub(crate) move_due: Script,
    pub(crate) keepalive: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            move_due: Script::new(MOVE_DUE),
            keepalive: Script::new(KEEPALIVE),
        }
    }
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A value as PHP's `uniqid('', true)` writes it (`%08x%05x` of the time in seconds and
/// microseconds, then a random digit, `.` and eight digits), unique within this process.
pub(crate) fn uniqid() -> String {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let n = seed.wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!(
        "{:08x}{:05x}{}.{:08}",
        now.as_secs(),
        now.subsec_micros(),
        (n / 100_000_000) % 10,
        n % 100_000_000
    )
}

/// The member PHP's `Connection::add` writes in `<stream>__queue` for a delayed message, with a
/// fresh `uniqid`.
pub(crate) fn queue_member(encoded: &SymfonyEncoded) -> String {
    crate::redis_field::queue_member(encoded, &uniqid())
}

/// A stream entry: its id and its `message` field (`None` for an entry deleted while pending,
/// which Redis returns without fields, or one without that field).
pub(crate) type Entry = (String, Option<Vec<u8>>);

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn items(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        Value::Map(m) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => Vec::new(),
    }
}

/// A reply's bytes, moved out of it.
fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

/// A reply's text, moved out of it when it is UTF-8 (an entry id always is).
pub(crate) fn into_text(v: Value) -> Option<String> {
    into_bytes(v).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}

/// `[[id, [field, value, ...]], ...]` (from `XCLAIM` or one stream of `XREADGROUP`). The ids and
/// the fields are moved out of the reply, not copied.
pub(crate) fn entries(v: Value) -> Vec<Entry> {
    items(v)
        .into_iter()
        .filter_map(|entry| {
            let mut parts = items(entry).into_iter();
            let id = into_text(parts.next()?)?;
            let mut fields = items(parts.next().unwrap_or(Value::Nil)).into_iter();
            let mut message = None;
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                if matches!(&name, Value::BulkString(b) if b == b"message")
                    || matches!(&name, Value::SimpleString(s) if s == "message")
                {
                    message = into_bytes(value);
                    break;
                }
            }
            Some((id, message))
        })
        .collect()
}

/// The entries of `XREADGROUP`'s reply (one stream; nil when none came).
pub(crate) fn read_reply(v: Value) -> Vec<Entry> {
    let mut streams = items(v).into_iter();
    let mut out = Vec::new();
    // RESP2: [[name, entries], ...]; RESP3 map: name, entries, ...
    while let Some(first) = streams.next() {
        match first {
            Value::Array(pair) => {
                let mut pair = pair.into_iter();
                let _name = pair.next();
                out.extend(entries(pair.next().unwrap_or(Value::Nil)));
            }
            _ => out.extend(entries(streams.next().unwrap_or(Value::Nil))),
        }
    }
    out
}

/// The ids of `XPENDING`'s extended reply `[[id, consumer, idle, deliveries], ...]`.
pub(crate) fn pending_ids(v: Value) -> Vec<String> {
    items(v)
        .into_iter()
        .filter_map(|p| items(p).first().and_then(text))
        .collect()
}

/// The `name`s of `XINFO GROUPS`'s reply (a list of field-value lists, or maps).
pub(crate) fn group_names(v: Value) -> Vec<String> {
    items(v)
        .into_iter()
        .filter_map(|group| {
            let fields = items(group);
            fields
                .chunks(2)
                .find(|kv| text(&kv[0]).as_deref() == Some("name"))
                .and_then(|kv| kv.get(1).and_then(text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniqids_look_like_phps_and_differ() {
        let a = uniqid();
        let b = uniqid();
        assert_ne!(a, b);
        let (hex, digits) = a.split_at(14);
        assert!(hex[..13].bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert!(digits.starts_with('.') && digits.len() == 9, "{a}");
    }

    #[test]
    fn replies_are_read_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry = Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("message"), bulk("x")]),
        ]);
        let deleted = Value::Array(vec![bulk("2-0"), Value::Nil]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![entry.clone(), deleted.clone()]),
        ])]);
        let resp3 = Value::Map(vec![(bulk("s"), Value::Array(vec![entry, deleted]))]);
        let want = vec![
            ("1-0".to_owned(), Some(b"x".to_vec())),
            ("2-0".to_owned(), None),
        ];
        assert_eq!(read_reply(resp2), want);
        assert_eq!(read_reply(resp3), want);
        assert!(read_reply(Value::Nil).is_empty());
    }
}
