//! [`RedisOptions`]: the stream, group, consumer and timing of a [`RedisTransport`](crate::RedisTransport).

use std::time::Duration;

use courier_core::{Dsn, KeyPath};

/// Options of a [`RedisTransport`](crate::RedisTransport), also read from the DSN query:
/// `redis://127.0.0.1:6379?stream=emails&group=mailers&redeliver_timeout=10min`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    /// The transport's name in errors and logs. Default `"redis"`.
    pub name: String,
    /// The stream key. Default `"messages"`. The delayed entries live in `<stream>:delayed`
    /// (sorted set, scored by due time in ms) and `<stream>:delayed:data` (hash).
    pub stream: String,
    /// The consumer group. Default `"courier"`.
    pub group: String,
    /// The consumer name. Default unique per transport: `host:pid:random`. A fixed name lets a
    /// restarted process take back its own pending entries at once.
    pub consumer: String,
    /// Delete entries from the stream once acked or rejected (`XDEL`). Default true; turn off
    /// when other groups read the same stream.
    pub delete_after_ack: bool,
    /// Trim the stream to about this many entries on each `XADD` (`MAXLEN ~`). Default none.
    /// Trimming drops the oldest entries even when undelivered.
    pub stream_max_entries: Option<u64>,
    /// A delivery idle (not acked, no keepalive) for longer than this is claimed by another
    /// consumer (`XAUTOCLAIM`). Default 30 s; the worker keeps what it holds alive.
    pub redeliver_timeout: Duration,
    /// How often `get` looks for stale deliveries. Default a quarter of `redeliver_timeout`,
    /// between 10 ms and 1 min.
    pub claim_interval: Option<Duration>,
    /// The database number, overriding the DSN path. Default from the DSN, else 0.
    pub db: Option<i64>,
    /// The longest a `get` blocks (`XREADGROUP BLOCK`) before returning empty. Default 1 s.
    pub poll_window: Duration,
    /// How long a worker may go without a heartbeat before the worker registry
    /// (`<group>:workers`) counts it as gone. Default 30 s.
    pub worker_stale_after: Duration,
    /// How message bodies are written: `json` (default) or `msgpack` (see
    /// [`Serializer`](courier_core::Serializer)); reading follows each message's content type.
    pub serializer: courier_core::Serializer,
    /// At most this many messages with the same concurrency key are delivered and not yet
    /// acknowledged at once, across every worker and host (DSN `concurrency_max=N`, at least 1).
    /// Turns the queue into a keyed queue: see the crate documentation. Default none.
    pub concurrency_max: Option<u32>,
    /// Where a message's concurrency key is found in its JSON body when it carries no
    /// [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp) (DSN
    /// `concurrency_key=$.tenant_id`). Default none: only stamped messages are keyed.
    pub concurrency_key: Option<KeyPath>,
    /// Hand out one message per key in turn (DSN `fair=true`), so one key's backlog never
    /// starves the others. Turns the queue into a keyed queue. Default false.
    pub fair: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            name: "redis".into(),
            stream: "messages".into(),
            group: "courier".into(),
            consumer: default_consumer(),
            delete_after_ack: true,
            stream_max_entries: None,
            redeliver_timeout: Duration::from_secs(30),
            claim_interval: None,
            db: None,
            poll_window: Duration::from_secs(1),
            worker_stale_after: courier_core::DEFAULT_WORKER_STALE_AFTER,
            serializer: courier_core::Serializer::Json,
            concurrency_max: None,
            concurrency_key: None,
            fair: false,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $field:ident: $ty:ty) => {
        $(#[$doc])*
        #[must_use]
        pub fn $field(mut self, value: impl Into<$ty>) -> Self {
            self.$field = value.into();
            self
        }
    };
}

impl RedisOptions {
    setter!(/// Sets [`RedisOptions::name`].
        name: String);
    setter!(/// Sets [`RedisOptions::stream`].
        stream: String);
    setter!(/// Sets [`RedisOptions::group`].
        group: String);
    setter!(/// Sets [`RedisOptions::consumer`].
        consumer: String);
    setter!(/// Sets [`RedisOptions::delete_after_ack`].
        delete_after_ack: bool);
    setter!(/// Sets [`RedisOptions::stream_max_entries`].
        stream_max_entries: Option<u64>);
    setter!(/// Sets [`RedisOptions::redeliver_timeout`].
        redeliver_timeout: Duration);
    setter!(/// Sets [`RedisOptions::claim_interval`].
        claim_interval: Option<Duration>);
    setter!(/// Sets [`RedisOptions::db`].
        db: Option<i64>);
    setter!(/// Sets [`RedisOptions::poll_window`].
        poll_window: Duration);
    setter!(/// Sets [`RedisOptions::worker_stale_after`].
        worker_stale_after: Duration);
    setter!(/// Sets [`RedisOptions::serializer`].
        serializer: courier_core::Serializer);
    setter!(/// Sets [`RedisOptions::fair`].
        fair: bool);

    /// Sets [`RedisOptions::concurrency_max`] (0 is taken as 1).
    #[must_use]
    pub fn concurrency_max(mut self, max: u32) -> Self {
        self.concurrency_max = Some(max.max(1));
        self
    }

    /// Sets [`RedisOptions::concurrency_key`].
    ///
    /// # Errors
    /// A reason naming a path that [`KeyPath::parse`] refuses.
    pub fn concurrency_key(mut self, path: &str) -> Result<Self, String> {
        self.concurrency_key = Some(KeyPath::parse(path)?);
        Ok(self)
    }

    /// Whether the queue is keyed (a concurrency limit or fair hand-out is configured).
    #[must_use]
    pub fn is_keyed(&self) -> bool {
        self.concurrency_max.is_some() || self.fair
    }

    /// The flow-control options make sense together.
    pub(crate) fn check_flow_control(&self) -> Result<(), String> {
        if self.concurrency_key.is_some() && !self.is_keyed() {
            return Err(
                "concurrency_key needs concurrency_max=N or fair=true (a key alone changes nothing)"
                    .to_owned(),
            );
        }
        if self.concurrency_key.is_some() && self.serializer != courier_core::Serializer::Json {
            return Err("concurrency_key reads the JSON body: it needs serializer=json".to_owned());
        }
        if self.is_keyed() && !self.delete_after_ack {
            return Err(
                "concurrency_max and fair keep messages in lists per key, not in the stream: \
                 delete_after_ack=false (a stream shared with other groups) does not apply"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// The option names a DSN may carry.
    pub const DSN_OPTIONS: &'static [&'static str] = &[
        "stream",
        "group",
        "consumer",
        "delete_after_ack",
        "stream_max_entries",
        "redeliver_timeout",
        "claim_interval",
        "db",
        "poll_window",
        "worker_stale_after",
        "serializer",
        "concurrency_max",
        "concurrency_key",
        "fair",
    ];

    /// Reads the options from a DSN's query, on top of `self`.
    ///
    /// # Errors
    /// A reason naming an unknown option or a bad value.
    pub fn from_dsn(mut self, dsn: &Dsn) -> Result<Self, String> {
        dsn.check_options(Self::DSN_OPTIONS).map_err(|e| e.reason)?;
        let text = |key: &str| -> Result<Option<String>, String> {
            match dsn.option(key) {
                Some("") => Err(format!("option `{key}` is empty")),
                Some(v) if v.contains(char::is_whitespace) => {
                    Err(format!("option `{key}` contains whitespace"))
                }
                other => Ok(other.map(str::to_owned)),
            }
        };
        if let Some(v) = text("stream")? {
            self.stream = v;
        }
        if let Some(v) = dsn
            .parse_option::<courier_core::Serializer>("serializer")
            .map_err(|e| e.reason)?
        {
            self.serializer = v;
        }
        if let Some(v) = text("group")? {
            self.group = v;
        }
        if let Some(v) = text("consumer")? {
            self.consumer = v;
        }
        if let Some(v) = dsn
            .parse_option::<bool>("delete_after_ack")
            .map_err(|e| e.reason)?
        {
            self.delete_after_ack = v;
        }
        if let Some(v) = dsn
            .parse_option::<u64>("stream_max_entries")
            .map_err(|e| e.reason)?
        {
            self.stream_max_entries = (v > 0).then_some(v);
        }
        if let Some(v) = dsn
            .duration_option("redeliver_timeout")
            .map_err(|e| e.reason)?
        {
            self.redeliver_timeout = v;
        }
        if let Some(v) = dsn
            .duration_option("claim_interval")
            .map_err(|e| e.reason)?
        {
            self.claim_interval = Some(v);
        }
        if let Some(v) = dsn.parse_option::<i64>("db").map_err(|e| e.reason)? {
            self.db = Some(v);
        }
        if let Some(v) = dsn.duration_option("poll_window").map_err(|e| e.reason)? {
            self.poll_window = v;
        }
        if let Some(v) = dsn
            .duration_option("worker_stale_after")
            .map_err(|e| e.reason)?
        {
            if v.is_zero() {
                return Err("option `worker_stale_after` must be more than 0".to_owned());
            }
            self.worker_stale_after = v;
        }
        if let Some(n) = dsn
            .parse_option::<u32>("concurrency_max")
            .map_err(|e| e.reason)?
        {
            if n == 0 {
                return Err(
                    "concurrency_max must be at least 1 (0 would never deliver a keyed message)"
                        .to_owned(),
                );
            }
            self.concurrency_max = Some(n);
        }
        if let Some(p) = dsn.option("concurrency_key") {
            self.concurrency_key = Some(KeyPath::parse(p)?);
        }
        if let Some(v) = dsn.parse_option::<bool>("fair").map_err(|e| e.reason)? {
            self.fair = v;
        }
        self.check_flow_control()?;
        Ok(self)
    }

    /// The claim interval in effect.
    pub(crate) fn effective_claim_interval(&self) -> Duration {
        self.claim_interval.unwrap_or_else(|| {
            (self.redeliver_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(60))
        })
    }

    pub(crate) fn delayed_key(&self) -> String {
        format!("{}:delayed", self.stream)
    }

    /// The worker registry's hash: `<group>:workers` (the default group gives
    /// `courier:workers`); the ids asked to stop are in the set `<group>:workers:stop`.
    pub(crate) fn workers_key(&self) -> String {
        format!("{}:workers", self.group)
    }

    /// A schedule's hash: `<group>:schedule:<name>` (`courier:schedule:nightly`).
    pub(crate) fn schedule_key(&self, schedule: &str) -> String {
        format!("{}:schedule:{schedule}", self.group)
    }

    /// The prefix of a keyed queue's keys: `<stream>:keyed:`.
    pub(crate) fn keyed_prefix(&self) -> String {
        format!("{}:keyed:", self.stream)
    }

    pub(crate) fn delayed_data_key(&self) -> String {
        format!("{}:delayed:data", self.stream)
    }
}

/// `host:pid:random`, unique per call.
fn default_consumer() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().replace(char::is_whitespace, "-"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}:{:08x}", std::process::id(), fastrand::u32(..))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn dsn_options_override_defaults() {
        let dsn = Dsn::parse("redis://127.0.0.1:6379?stream=s&group=g&consumer=c&delete_after_ack=false&stream_max_entries=100&redeliver_timeout=30s&claim_interval=5s&db=3&poll_window=250ms").unwrap();
        let o = RedisOptions::default().from_dsn(&dsn).unwrap();
        assert_eq!(
            (o.stream.as_str(), o.group.as_str(), o.consumer.as_str()),
            ("s", "g", "c")
        );
        assert!(!o.delete_after_ack);
        assert_eq!(o.stream_max_entries, Some(100));
        assert_eq!(o.redeliver_timeout, Duration::from_secs(30));
        assert_eq!(o.effective_claim_interval(), Duration::from_secs(5));
        assert_eq!(o.db, Some(3));
        assert_eq!(o.poll_window, Duration::from_millis(250));
    }

    #[test]
    fn flow_control_options_are_read_and_checked() {
        let dsn =
            Dsn::parse("redis://localhost?concurrency_max=3&concurrency_key=$.tenant&fair=true")
                .unwrap();
        let o = RedisOptions::default().from_dsn(&dsn).unwrap();
        assert_eq!(o.concurrency_max, Some(3));
        assert_eq!(
            o.concurrency_key.as_ref().map(KeyPath::as_str),
            Some("$.tenant")
        );
        assert!(o.fair && o.is_keyed());
        for (query, expected) in [
            ("concurrency_max=0", "concurrency_max must be at least 1"),
            (
                "concurrency_max=2&concurrency_key=tenant",
                "concurrency_key `tenant`: expected a JSON path",
            ),
            (
                "concurrency_key=$.tenant",
                "concurrency_key needs concurrency_max=N or fair=true",
            ),
            ("fair=true&delete_after_ack=false", "delete_after_ack=false"),
            (
                "concurrency_max=2&concurrency_key=$.t&serializer=msgpack",
                "needs serializer=json",
            ),
        ] {
            let dsn = Dsn::parse(&format!("redis://localhost?{query}")).unwrap();
            let e = RedisOptions::default().from_dsn(&dsn).unwrap_err();
            assert!(e.contains(expected), "{query}: {e}");
        }
    }

    #[test]
    fn unknown_option_is_refused() {
        let dsn = Dsn::parse("redis://127.0.0.1?streem=x").unwrap();
        let err = RedisOptions::default().from_dsn(&dsn).unwrap_err();
        assert!(err.contains("unknown option `streem`"), "{err}");
    }

    #[test]
    fn default_consumers_are_unique_and_claim_interval_follows_timeout() {
        let (a, b) = (RedisOptions::default(), RedisOptions::default());
        assert_ne!(a.consumer, b.consumer);
        assert_eq!(a.effective_claim_interval(), Duration::from_millis(7_500));
        let short = a.redeliver_timeout(Duration::from_millis(200));
        assert_eq!(short.effective_claim_interval(), Duration::from_millis(50));
    }
}
