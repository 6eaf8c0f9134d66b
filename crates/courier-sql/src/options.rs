//! [`SqlOptions`]: what the DSN query (or code) configures, with validation.

use std::time::Duration;

use courier_core::{Dsn, DsnError};

use crate::PoolSettings;
use crate::dialect::{invalid_table_name, is_valid_identifier};

pub use courier_core::KeyPath;

/// The options of a [`SqlTransport`](crate::SqlTransport).
///
/// From a DSN query: `table_name`, `queue_name`, `redeliver_timeout`, `auto_setup`,
/// `poll_window`, `max_connections`, `min_connections`, `acquire_timeout`, `worker_stale_after`
/// (the worker registry's), `serializer` (`json`, the default, or `msgpack`: see
/// [`Serializer`](courier_core::Serializer)), on PostgreSQL `cursor` (a cursor outbox, see
/// [`SqlOptions::cursor`]), `concurrency_max`, `concurrency_key` and `fair` (flow control per
/// key, see [`SqlOptions::concurrency_max`]), and on SQLite `busy_timeout`. Durations are
/// humantime strings (`250ms`, `30s`, `1h`).
///
/// ```
/// use courier_core::Dsn;
/// use courier_sql::SqlOptions;
/// use std::time::Duration;
///
/// let dsn = Dsn::parse("sqlite://courier.db?queue_name=failed&redeliver_timeout=10min")?;
/// let options = SqlOptions::from_dsn(&dsn)?;
/// assert_eq!(options.queue(), "failed");
/// assert_eq!(options.redelivery_window(), Duration::from_secs(600));
///
/// let bad = Dsn::parse("sqlite://courier.db?table_name=x;DROP%20TABLE%20users")?;
/// let err = SqlOptions::from_dsn(&bad).unwrap_err().to_string();
/// assert!(err.contains("invalid table name"), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlOptions {
    pub(crate) table_name: String,
    pub(crate) queue_name: String,
    pub(crate) redeliver_timeout: Duration,
    pub(crate) auto_setup: bool,
    pub(crate) poll_window: Duration,
    pub(crate) max_connections: Option<u32>,
    pub(crate) min_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) busy_timeout: Duration,
    pub(crate) worker_stale_after: Duration,
    pub(crate) serializer: courier_core::Serializer,
    pub(crate) cursor: bool,
    pub(crate) listen: bool,
    pub(crate) concurrency_max: Option<u32>,
    pub(crate) concurrency_key: Option<KeyPath>,
    pub(crate) fair: bool,
}

impl Default for SqlOptions {
    fn default() -> Self {
        Self {
            table_name: DEFAULT_TABLE.to_owned(),
            queue_name: "default".to_owned(),
            redeliver_timeout: Duration::from_secs(30),
            auto_setup: true,
            poll_window: Duration::from_secs(1),
            max_connections: None,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(10),
            worker_stale_after: courier_core::DEFAULT_WORKER_STALE_AFTER,
            serializer: courier_core::Serializer::Json,
            cursor: false,
            listen: true,
            concurrency_max: None,
            concurrency_key: None,
            fair: false,
        }
    }
}

/// The default table name (the one written in `migrations/`).
pub const DEFAULT_TABLE: &str = "courier_messages";

/// The DSN query options Courier reads itself (the rest go to the driver).
pub(crate) const COURIER_OPTIONS: &[&str] = &[
    "table_name",
    "queue_name",
    "redeliver_timeout",
    "auto_setup",
    "poll_window",
    "max_connections",
    "min_connections",
    "acquire_timeout",
    "busy_timeout",
    "worker_stale_after",
    "serializer",
    "cursor",
    "listen",
    "concurrency_max",
    "concurrency_key",
    "fair",
];

impl From<&SqlOptions> for PoolSettings {
    fn from(o: &SqlOptions) -> Self {
        Self {
            max_connections: o.max_connections,
            min_connections: o.min_connections,
            acquire_timeout: o.acquire_timeout,
            busy_timeout: o.busy_timeout,
            read_committed: false,
            // Every statement on the queue table is an index walk (see `Statements`).
            ordered_scans: true,
        }
    }
}

impl SqlOptions {
    /// Reads the options from a DSN query, starting from the defaults.
    ///
    /// # Errors
    /// [`DsnError`] naming a bad value, e.g. a `table_name` that is not a plain identifier.
    pub fn from_dsn(dsn: &Dsn) -> Result<Self, DsnError> {
        let mut o = Self::default();
        let bad = |reason: String| DsnError::new(dsn.expose(), reason);
        if let Some(t) = dsn.option("table_name") {
            if !is_valid_identifier(t) {
                return Err(bad(format!("table_name: {}", invalid_table_name(t))));
            }
            o.table_name = t.to_owned();
        }
        if let Some(q) = dsn.option("queue_name") {
            if q.is_empty() || q.len() > 190 {
                return Err(bad("invalid queue_name: expected 1 to 190 bytes".to_owned()));
            }
            o.queue_name = q.to_owned();
        }
        if let Some(t) = dsn.duration_option("redeliver_timeout")? {
            o.redeliver_timeout = t;
        }
        if let Some(b) = dsn.parse_option::<bool>("auto_setup")? {
            o.auto_setup = b;
        }
        if let Some(t) = dsn.duration_option("poll_window")? {
            o.poll_window = t;
        }
        if let Some(n) = dsn.parse_option::<u32>("max_connections")? {
            if n == 0 {
                return Err(bad("max_connections must be at least 1".to_owned()));
            }
            o.max_connections = Some(n);
        }
        if let Some(n) = dsn.parse_option::<u32>("min_connections")? {
            o.min_connections = n;
        }
        if let Some(t) = dsn.duration_option("acquire_timeout")? {
            o.acquire_timeout = t;
        }
        if let Some(t) = dsn.duration_option("busy_timeout")? {
            o.busy_timeout = t;
        }
        if let Some(t) = dsn.duration_option("worker_stale_after")? {
            if t.is_zero() {
                return Err(bad("worker_stale_after must be more than 0".to_owned()));
            }
            o.worker_stale_after = t;
        }
        if let Some(s) = dsn.parse_option::<courier_core::Serializer>("serializer")? {
            o.serializer = s;
        }
        if let Some(b) = dsn.parse_option::<bool>("cursor")? {
            o.cursor = b;
        }
        if let Some(b) = dsn.parse_option::<bool>("listen")? {
            o.listen = b;
        }
        if let Some(n) = dsn.parse_option::<u32>("concurrency_max")? {
            if n == 0 {
                return Err(bad(
                    "concurrency_max must be at least 1 (0 would never deliver a keyed message)"
                        .to_owned(),
                ));
            }
            o.concurrency_max = Some(n);
        }
        if let Some(p) = dsn.option("concurrency_key") {
            o.concurrency_key = Some(KeyPath::parse(p).map_err(bad)?);
        }
        if let Some(b) = dsn.parse_option::<bool>("fair")? {
            o.fair = b;
        }
        o.check_flow_control().map_err(bad)?;
        Ok(o)
    }

    /// Sets the table (default `courier_messages`).
    ///
    /// # Errors
    /// A message naming the bad name when [`is_valid_identifier`] refuses it.
    pub fn table_name(mut self, name: impl Into<String>) -> Result<Self, String> {
        let name = name.into();
        if !is_valid_identifier(&name) {
            return Err(invalid_table_name(&name));
        }
        self.table_name = name;
        Ok(self)
    }

    /// Sets the queue (default `default`); several queues share one table.
    #[must_use]
    pub fn queue_name(mut self, name: impl Into<String>) -> Self {
        self.queue_name = name.into();
        self
    }

    /// Sets how long a delivered, unacknowledged message waits before it is delivered again
    /// (default 30 s; the worker keeps every message it holds alive at a third of it, so only a
    /// dead worker's messages wait it out).
    #[must_use]
    pub fn redeliver_timeout(mut self, timeout: Duration) -> Self {
        self.redeliver_timeout = timeout;
        self
    }

    /// Makes the queue a cursor outbox (default `false`; PostgreSQL only): each row records the
    /// transaction that wrote it, and a [`Relay`](courier_core::relay::Relay) reads the queue
    /// by a cursor ([`CursorSource`](crate::relay::CursorSource)): a plain read of each row and
    /// a range delete per batch, instead of locking and deleting row by row. The relay forwards
    /// in the order of the writing transactions (priorities are not honoured) and hands the
    /// destination what is left of a message's delay. Every writer of the queue and its relay
    /// use the same setting; rows written without it are adopted when a transport with it
    /// connects, and by the relay's reads (once one finds nothing for a poll window, and every
    /// minute), with a warning. A cursor outbox is for one relay at a time (others wait on its
    /// lease), not for workers: its `get` fails, saying so.
    #[must_use]
    pub fn cursor(mut self, on: bool) -> Self {
        self.cursor = on;
        self
    }

    /// PostgreSQL: whether waiting consumers are woken by `LISTEN`/`NOTIFY` (default `true`).
    /// The listener holds one connection of the transport's pool for as long as the transport
    /// lives (on a pool shared with the application through
    /// [`SqlTransport::from_pool`](crate::SqlTransport::from_pool), one of its connections):
    /// with `false` (DSN `listen=false`) it takes none, and consumers poll with the adaptive
    /// backoff of SQLite and MySQL (5 ms doubling to 250 ms) instead. Senders still notify.
    #[must_use]
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = on;
        self
    }

    /// Limits how many messages with the same concurrency key (a
    /// [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp), or the field
    /// [`concurrency_key`](Self::concurrency_key) names) are delivered and not yet acknowledged
    /// at once, across every worker and host (DSN `concurrency_max=N`, at least 1). The claim
    /// counts the key's rows under a live delivery lease in the same statement that claims, so
    /// a slot is the delivered row itself: an ack, reject or retry frees it, and a killed
    /// worker's frees itself when its lease (the redelivery window) runs out. Messages without
    /// a key are not limited. A full key's messages wait without holding up other keys.
    #[must_use]
    pub fn concurrency_max(mut self, max: u32) -> Self {
        self.concurrency_max = Some(max.max(1));
        self
    }

    /// Derives each message's concurrency key from a string field of its JSON body (DSN
    /// `concurrency_key=$.tenant_id`); a [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp)
    /// wins over it. A message whose field is missing or not a string is refused at send, with
    /// an error naming the path.
    ///
    /// # Errors
    /// A message naming a path that [`KeyPath::parse`] refuses.
    pub fn concurrency_key(mut self, path: &str) -> Result<Self, String> {
        self.concurrency_key = Some(KeyPath::parse(path)?);
        Ok(self)
    }

    /// Claims round-robin across concurrency keys (DSN `fair=true`; default `false`, strict
    /// FIFO by priority then age): a key's n-th waiting message goes before any key's
    /// (n+1)-th, FIFO inside a key, so one key's backlog never starves the others. Unkeyed
    /// messages share one lane. Cost: each claim ranks every claimable row of the queue (a
    /// window function over the backlog), where FIFO reads only the head of its index.
    #[must_use]
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// Whether rows carry a concurrency key (a limit or fairness is configured).
    pub(crate) fn keyed(&self) -> bool {
        self.concurrency_max.is_some() || self.fair
    }

    /// The flow-control options make sense together.
    pub(crate) fn check_flow_control(&self) -> Result<(), String> {
        if self.concurrency_key.is_some() && !self.keyed() {
            return Err(
                "concurrency_key needs concurrency_max=N or fair=true (a key alone changes nothing)"
                    .to_owned(),
            );
        }
        if self.concurrency_key.is_some() && self.serializer != courier_core::Serializer::Json {
            return Err("concurrency_key reads the JSON body: it needs serializer=json".to_owned());
        }
        if self.keyed() && self.cursor {
            return Err(
                "concurrency_max and fair are for claimed queues, not a cursor outbox (cursor=true)"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Whether the queue is a cursor outbox (see [`SqlOptions::cursor`]).
    #[must_use]
    pub fn is_cursor(&self) -> bool {
        self.cursor
    }

    /// Sets whether the transport creates its table on connect (default `true`).
    #[must_use]
    pub fn auto_setup(mut self, on: bool) -> Self {
        self.auto_setup = on;
        self
    }

    /// Sets how long `get` waits for a message before returning empty (default 1 s).
    #[must_use]
    pub fn poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// Sets the pool size (default 10 on servers, 4 on SQLite files, 1 for `:memory:`).
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = Some(n.max(1));
        self
    }

    /// Sets how many idle connections the pool keeps open (default 0).
    #[must_use]
    pub fn min_connections(mut self, n: u32) -> Self {
        self.min_connections = n;
        self
    }

    /// Sets how long an operation waits for a pooled connection (default 30 s).
    #[must_use]
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets the body serializer (`json` by default; reading follows each message's content
    /// type either way).
    #[must_use]
    pub fn serializer(mut self, serializer: courier_core::Serializer) -> Self {
        self.serializer = serializer;
        self
    }

    /// The body serializer (default JSON).
    #[must_use]
    pub fn body_serializer(&self) -> courier_core::Serializer {
        self.serializer
    }

    /// Sets SQLite's busy timeout: how long a writer waits for the file lock (default 10 s).
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Sets how long a worker may go without a heartbeat before the worker registry
    /// (`<table>_workers`) counts it as gone (default 30 s; workers heartbeat every 2 s, or a
    /// third of this when shorter).
    #[must_use]
    pub fn worker_stale_after(mut self, stale_after: Duration) -> Self {
        self.worker_stale_after = stale_after;
        self
    }

    /// The table name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table_name
    }

    /// The queue name.
    #[must_use]
    pub fn queue(&self) -> &str {
        &self.queue_name
    }

    /// The redelivery window.
    #[must_use]
    pub fn redelivery_window(&self) -> Duration {
        self.redeliver_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_name_injection_in_the_dsn_is_rejected_with_a_clear_error() {
        let dsn = Dsn::parse(
            "postgres://app:hunter2@db/app?table_name=messages%3B%20DROP%20TABLE%20users%3B--",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let err = SqlOptions::from_dsn(&dsn)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("invalid table name `messages; DROP TABLE users;--`"),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn options_parse_from_the_dsn() {
        let dsn = Dsn::parse("sqlite://x.db?queue_name=failed&redeliver_timeout=5min&auto_setup=false&poll_window=50ms")
            .unwrap_or_else(|e| panic!("{e}"));
        let o = SqlOptions::from_dsn(&dsn).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.queue_name, "failed");
        assert_eq!(o.redeliver_timeout, Duration::from_secs(300));
        assert!(!o.auto_setup);
        assert_eq!(o.poll_window, Duration::from_millis(50));
        assert_eq!(o.table_name, DEFAULT_TABLE);
    }
}
