//! The deliveries this process holds: parsed stream ids in a map with a cheap hasher, so that
//! `get` and `ack` neither copy nor hash id text per message.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use tokio::time::Instant;

/// A stream entry id, `<ms>-<seq>`, as two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StreamId {
    ms: u64,
    seq: u64,
}

impl StreamId {
    /// Parses `<ms>-<seq>`; `None` for anything else (a delayed entry's `d-...` id, say).
    pub(crate) fn parse(id: &str) -> Option<Self> {
        let (ms, seq) = id.split_once('-')?;
        let number = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                None
            } else {
                s.parse().ok()
            }
        };
        Some(Self {
            ms: number(ms)?,
            seq: number(seq)?,
        })
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A multiply-rotate hasher for [`StreamId`]s. Ids are assigned by the server, not chosen by
/// an attacker, so a keyed hash buys nothing here.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// In-flight deliveries: entry id -> (delivery count, local time before the request that
/// delivered or last kept it alive).
pub(crate) type InFlight = HashMap<StreamId, (u64, Instant), BuildHasherDefault<IdHasher>>;

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn parses_stream_ids_and_writes_them_back() {
        let id = StreamId::parse("1700000000000-12").unwrap();
        assert_eq!(id.to_string(), "1700000000000-12");
        for bad in [
            "",
            "1700000000000",
            "d-abc",
            "1-x",
            "-1",
            "1-",
            "+1-2",
            "1-2-3",
        ] {
            assert_eq!(StreamId::parse(bad), None, "{bad}");
        }
        assert_ne!(
            StreamId::parse("1-2").unwrap(),
            StreamId::parse("2-1").unwrap()
        );
    }

    #[test]
    fn the_map_tells_ids_apart() {
        let mut map = InFlight::default();
        let now = Instant::now();
        for ms in 0..100 {
            for seq in 0..10 {
                map.insert(StreamId { ms, seq }, (ms * seq, now));
            }
        }
        assert_eq!(map.len(), 1000);
        assert_eq!(map.get(&StreamId { ms: 7, seq: 3 }).map(|v| v.0), Some(21));
    }
}
