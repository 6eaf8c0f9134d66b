//! The dialect seam: what [`SqlTransport`](crate::SqlTransport) asks of each database, and the
//! row types that cross it. Each dialect renders its SQL once, with the validated table name.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::migrate::Applied;

/// A message to insert.
#[derive(Debug, Clone)]
pub(crate) struct NewRow {
    pub(crate) body: String,
    pub(crate) headers: String,
    pub(crate) priority: i16,
    /// Milliseconds after the database's now.
    pub(crate) delay_ms: i64,
    /// The concurrency key (written on queues with flow control only).
    pub(crate) key: Option<String>,
}

/// A stored message as read back. Body and headers are read as bytes, in a way that cannot
/// fail on their type or encoding (a BLOB, an integer, bytes that are not UTF-8, a NULL), so one
/// bad row never fails a claim: it decodes to an undecodable envelope that keeps its bytes.
#[derive(Debug)]
pub(crate) struct StoredRow {
    pub(crate) id: i64,
    pub(crate) body: Vec<u8>,
    /// `None` when NULL or unreadable.
    pub(crate) headers: Option<Vec<u8>>,
    pub(crate) priority: i16,
    pub(crate) available_at: i64,
}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for StoredRow
where
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get("id")?,
            body: column_bytes(row, "body").unwrap_or_default(),
            headers: column_bytes(row, "headers"),
            // Only used to order a claim: a value of the wrong type sorts as 0.
            priority: row.try_get("priority").unwrap_or_default(),
            available_at: row.try_get("available_at").unwrap_or_default(),
        })
    }
}

/// A text column's bytes: as text when it is text, else as whatever bytes the driver has for
/// it (SQLite gives a BLOB's bytes, or an integer's digits; MySQL the raw bytes). `None` when
/// NULL or unreadable.
fn column_bytes<'r, R: sqlx::Row>(row: &'r R, column: &'static str) -> Option<Vec<u8>>
where
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database>,
{
    match row.try_get::<Option<String>, _>(column) {
        Ok(text) => text.map(String::into_bytes),
        Err(_) => row
            .try_get_unchecked::<Option<Vec<u8>>, _>(column)
            .ok()
            .flatten(),
    }
}

/// Sorts claimed rows into claim order (`RETURNING` gives no order guarantee).
pub(crate) fn sort_claimed(rows: &mut [StoredRow]) {
    rows.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.available_at.cmp(&b.available_at))
            .then(a.id.cmp(&b.id))
    });
}

/// Wake-ups for waiting consumers: a version bumped by local sends and (PostgreSQL) by
/// `NOTIFY`s, plus whether server push is currently live.
#[derive(Debug)]
pub(crate) struct Wake {
    pub(crate) version: watch::Sender<u64>,
    pub(crate) listening: AtomicBool,
}

impl Wake {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            version: watch::Sender::new(0),
            listening: AtomicBool::new(false),
        })
    }

    /// Wakes every waiting consumer of this transport.
    pub(crate) fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "only PostgreSQL has server push")
    )]
    pub(crate) fn set_listening(&self, on: bool) {
        self.listening.store(on, Ordering::Release);
    }

    pub(crate) fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }
}

/// A cursor outbox's statements (PostgreSQL with `cursor=true`, see
/// [`CursorSource`](crate::relay::CursorSource)). Positions are (writing transaction id, row id).
#[async_trait]
pub(crate) trait CursorRows: Send + Sync + Debug {
    /// Gives the queue's rows written without a transaction id one (the current
    /// transaction's, after every position read so far); returns how many.
    async fn adopt(&self) -> Result<u64, sqlx::Error>;
    /// Opens a session of its own, ended by the server once it sits silent `lease`, and takes
    /// the queue's cursor there for `owner`: the session and the cursor's position; `None`
    /// while another session holds it.
    async fn acquire(
        &self,
        owner: &str,
        lease: std::time::Duration,
    ) -> Result<Option<(Box<dyn CursorSession>, (i64, i64))>, sqlx::Error>;
    /// Up to `max` rows after `after` whose writing transaction is older than every running
    /// one, in order, each with its transaction id and the milliseconds left of its delay.
    async fn read(
        &self,
        after: (i64, i64),
        max: usize,
    ) -> Result<Vec<(StoredRow, i64, i64)>, sqlx::Error>;
}

/// The session holding a cursor outbox's cursor (see [`CursorRows::acquire`]); dropping it
/// closes the session, and the cursor is free.
#[async_trait]
pub(crate) trait CursorSession: Send {
    /// Moves the cursor from `from` (where this session holds it) to `to`, deleting the rows
    /// it passes; `RowNotFound` if the cursor is not at `from` (moved by hand meanwhile).
    async fn advance(&mut self, from: (i64, i64), to: (i64, i64)) -> Result<(), sqlx::Error>;
    /// One round trip, so that the server does not end the session as silent.
    async fn renew(&mut self) -> Result<(), sqlx::Error>;
}

/// The message table on one database. Every method is one statement or one short transaction;
/// the caller retries transient errors.
#[async_trait]
pub(crate) trait Backend: Send + Sync + Debug {
    /// Applies the messages migrations not yet recorded; returns those it recorded.
    async fn setup(&self) -> Result<Vec<Applied>, sqlx::Error>;
    /// Takes a deduplication key for `ttl_ms` unless a live row holds it: `true` when taken.
    async fn dedup_take(&self, key: &str, ttl_ms: i64) -> Result<bool, sqlx::Error>;
    /// Frees a deduplication key.
    async fn dedup_release(&self, key: &str) -> Result<(), sqlx::Error>;
    /// Deletes up to `max` expired deduplication keys, oldest first, in one statement; returns
    /// how many went.
    async fn dedup_prune(&self, max: usize) -> Result<u64, sqlx::Error>;
    /// Inserts rows in one transaction that also takes the deduplication keys of those that
    /// have one (`keys[i]`: the key and TTL in ms of `rows[i]`): a row whose key is held (by a
    /// live key, or by an earlier row of the batch) is not inserted. Returns each row's id, `None`
    /// for the rows not inserted. Keys and rows commit together, or neither.
    async fn insert_keyed(
        &self,
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error>;
    /// [`insert_keyed`](Self::insert_keyed) on the caller's connection, inside its transaction
    /// (see [`insert_in`](Self::insert_in)): the keys commit or roll back with it.
    async fn insert_keyed_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error>;
    /// Inserts rows in one statement (or one transaction); returns their ids in order.
    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error>;

    /// After acks freed concurrency slots: wakes the queue's waiting consumers in other
    /// processes where the database pushes wake-ups (PostgreSQL `NOTIFY`, on a queue with a
    /// concurrency limit); elsewhere nothing.
    async fn slots_freed(&self) -> Result<(), sqlx::Error> {
        Ok(())
    }
    /// Inserts rows on the caller's connection (`conn` is the dialect's `sqlx` connection, inside
    /// the caller's transaction); returns their ids in order. Not retried, no write turn.
    async fn insert_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error>;
    /// Milliseconds since the oldest row of this queue was stored, `None` when it is empty.
    async fn oldest_age_ms(&self) -> Result<Option<i64>, sqlx::Error>;
    /// Claims up to `max` available rows with `delivery_id`; returns them in claim order.
    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error>;
    /// Deletes rows by (id, delivery_id), then claims up to `max` rows, in one transaction:
    /// both or neither (the acks of one batch ride on the claim of the next).
    async fn delete_and_claim(
        &self,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>;
    /// PostgreSQL: locks up to `max` claimable rows (`FOR UPDATE SKIP LOCKED`) in a
    /// transaction left open, tells `held`, then deletes them, returning them in claim order
    /// with the hold that commits it (errors named for transport `name`); the server ends the
    /// transaction once it sat idle `hold_for`. Elsewhere `None`.
    async fn drain(
        &self,
        _name: &str,
        _max: usize,
        _hold_for: std::time::Duration,
        _held: &tokio::sync::Notify,
    ) -> Option<Result<(Vec<StoredRow>, Box<dyn crate::relay::DrainHold>), sqlx::Error>> {
        None
    }
    /// The cursor outbox statements (PostgreSQL with `cursor=true`); elsewhere `None`.
    fn cursor(&self) -> Option<&dyn CursorRows> {
        None
    }
    /// Milliseconds from the database's now until the next row becomes claimable (`<= 0`: one
    /// is claimable now), `None` when the queue is empty.
    async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error>;
    /// Deletes rows by (id, delivery_id); returns how many went.
    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error>;
    /// Deletes one row by (id, delivery_id).
    async fn delete_one(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error>;
    /// Deletes rows of this queue by id alone (a statement per chunk of ids).
    async fn delete_ids(&self, ids: &[i64]) -> Result<u64, sqlx::Error>;
    /// Refreshes `delivered_at` of a live delivery.
    async fn keepalive(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error>;
    /// Refreshes `delivered_at` of live deliveries by (id, delivery_id) in one statement per
    /// chunk; returns how many were live.
    async fn keepalive_many(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error>;
    /// Puts a live delivery back: new headers and priority, available after `delay_ms`,
    /// delivery cleared. One statement.
    async fn reschedule(&self, id: i64, delivery_id: i64, row: &NewRow)
    -> Result<u64, sqlx::Error>;
    /// Up to `limit` rows of this queue, oldest first.
    async fn list(&self, limit: usize) -> Result<Vec<StoredRow>, sqlx::Error>;
    /// The row of this queue with `id`.
    async fn find(&self, id: i64) -> Result<Option<StoredRow>, sqlx::Error>;
    /// The number of rows of this queue.
    async fn count(&self) -> Result<i64, sqlx::Error>;
    /// A keyed queue's keys with their rows in flight (delivered under a live lease) and
    /// queued (ready to deliver), one `GROUP BY concurrency_key`; none for a plain queue.
    async fn key_loads(&self) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
        Ok(Vec::new())
    }
    /// Starts server push wake-ups if the dialect has them (idempotent).
    fn start_listener(&self, wake: &Arc<Wake>);
    /// The worker registry beside the message table (`<table>_workers`) on the same pool.
    fn workers(
        &self,
        name: &str,
        location: &str,
        stale_after: std::time::Duration,
    ) -> Box<dyn courier_core::WorkerRegistry>;
    /// The pause flag of `queue` (`<table>_paused`) on the same pool.
    fn pauses(&self, name: &str, queue: &str) -> Box<dyn courier_core::Pausable>;
    /// The rate-limit bucket of `queue` (`<table>_limits`) on the same pool.
    fn limits(&self, name: &str, queue: &str) -> Box<dyn courier_core::RateLimiter>;
    /// The schedule store beside the message table (`<table>_schedules`) on the same pool.
    fn schedules(&self, name: &str, location: &str) -> Box<dyn courier_core::ScheduleStore>;
    /// Applies the worker registry's and schedule store's migrations not yet recorded; returns
    /// those it recorded.
    async fn setup_workers(&self) -> Result<Vec<Applied>, sqlx::Error>;
    /// The migrations of the message table and the tables beside it not recorded (a schema
    /// Courier only checks, `auto_setup` off). Changes nothing.
    async fn missing_migrations(&self) -> Result<Vec<crate::migrate::Missing>, sqlx::Error> {
        Ok(Vec::new())
    }
    /// Server-side ids of the pool's connections, for tests that kill them.
    fn connection_ids(&self) -> Vec<u64>;
    /// The cause behind a pool that timed out, when one direct connection attempt finds it
    /// (the server is down, the credentials are refused); else `e` unchanged.
    async fn explain(&self, e: sqlx::Error) -> sqlx::Error;
}
