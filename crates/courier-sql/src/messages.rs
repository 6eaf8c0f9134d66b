//! The message table on any dialect: one executor generic over the sqlx driver, running the
//! statements of [`Statements`] (one template each, rendered per dialect and table). What truly
//! differs per dialect (inserting, batch predicates over PostgreSQL arrays, `LISTEN`, MySQL's
//! connection ids) is a [`MessageDialect`] hook, in `sqlite.rs`, `postgres.rs` and `mysql.rs`.

use std::fmt::{Debug, Write as _};
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Pool;
use tokio::sync::{Mutex, MutexGuard};

use crate::backend::{Backend, NewRow, StoredRow, Wake, sort_claimed};
use crate::migrate::{self, Applied};
use crate::{Dialect, SqlDatabase, SqlOptions};

/// Rows per statement in batch statements (well under every dialect's bound-parameter limit).
pub(crate) const CHUNK: usize = 500;

/// The columns a stored message is read with.
const COLUMNS: &str = "id, body, headers, priority, available_at";

/// What differs per dialect beyond the SQL text. Each hook is one statement or one short
/// transaction.
#[async_trait]
pub(crate) trait MessageDialect: SqlDatabase {
    /// What the dialect keeps beside its pool.
    type State: Send + Sync + Debug;

    /// Where this process's writes take turns, if the database has a single writer (SQLite);
    /// asked once per write (SQLite also wakes its WAL checkpointer there).
    fn writer(_state: &Self::State) -> Option<&Mutex<()>> {
        None
    }

    /// The pool this process's writes go through: the one pool, or (SQLite files) a pool of
    /// their own.
    fn write_pool(m: &Messages<Self>) -> &Pool<Self> {
        &m.pool
    }

    /// Inserts rows on `conn` in one statement (or one transaction, a savepoint inside the
    /// caller's); returns their ids in order.
    async fn insert(
        m: &Messages<Self>,
        conn: &mut Self::Connection,
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error>;

    /// Deletes these deliveries and claims up to `max` rows in one statement of the dialect's
    /// own ([`Statements::delete_and_claim`]); `None`: the caller uses one transaction.
    async fn delete_and_claim(
        _m: &Messages<Self>,
        _deliveries: &[(i64, i64)],
        _max: usize,
        _delivery_id: i64,
    ) -> Option<Result<Vec<StoredRow>, sqlx::Error>> {
        None
    }

    /// Locks up to `max` claimable rows in a transaction left open ([`Statements::drain`]),
    /// tells `held`, then deletes and returns them ([`Statements::drain_take`]), the server
    /// ending the transaction once it sat idle `hold_for`; `None`: the dialect cannot hold rows
    /// that way.
    async fn drain(
        _m: &Messages<Self>,
        _name: &str,
        _max: usize,
        _hold_for: std::time::Duration,
        _held: &tokio::sync::Notify,
    ) -> Option<Result<(Vec<StoredRow>, Box<dyn crate::relay::DrainHold>), sqlx::Error>> {
        None
    }

    /// The cursor outbox statements, where the dialect and options have them (PostgreSQL with
    /// `cursor=true`).
    fn cursor(_m: &Messages<Self>) -> Option<&dyn crate::backend::CursorRows> {
        None
    }

    /// Runs `head` (a `DELETE FROM t` or `UPDATE t SET ...`) for these deliveries in one
    /// statement of the dialect's own (PostgreSQL: arrays); `None`: the caller uses the portable
    /// grouped predicate.
    async fn for_deliveries(
        _m: &Messages<Self>,
        _conn: &mut Self::Connection,
        _head: &str,
        _deliveries: &[(i64, i64)],
    ) -> Option<Result<u64, sqlx::Error>> {
        None
    }

    /// Starts server push wake-ups (PostgreSQL `LISTEN`).
    fn start_listener(_m: &Messages<Self>, _wake: &Arc<Wake>) {}

    /// Server-side ids of the pool's connections (MySQL).
    fn connection_ids(_m: &Messages<Self>) -> Vec<u64> {
        Vec::new()
    }

    /// The cause behind a pool timeout, found by one direct connection attempt.
    async fn explain(_m: &Messages<Self>, e: sqlx::Error) -> sqlx::Error {
        e
    }
}

/// The statements of one table and queue, rendered for one dialect.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Claims in one statement (binds: queue, redelivery window, limit, delivery id); MySQL
    /// selects `FOR UPDATE SKIP LOCKED` with the same first three binds, then updates.
    pub(crate) claim: String,
    /// PostgreSQL: deletes acked (id, delivery id) pairs and claims, in one statement (binds:
    /// ids, delivery ids, then the claim's); elsewhere `None` (one transaction instead).
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) delete_and_claim: Option<String>,
    /// PostgreSQL: locks the rows the claim would pick `FOR UPDATE SKIP LOCKED`, in its order,
    /// and returns their ids (binds: queue, redelivery window, limit); elsewhere `None`.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) drain: Option<String>,
    /// PostgreSQL: deletes the rows [`drain`](Self::drain) locked and returns them (bind: the
    /// ids); elsewhere `None`.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) drain_take: Option<String>,
    pub(crate) next_due: String,
    pub(crate) delete_one: String,
    /// `DELETE ... WHERE queue_name = ? AND id IN ` (the id list follows, one bind each).
    pub(crate) delete_ids: String,
    pub(crate) keepalive: String,
    /// The head of a batch keepalive, before its deliveries predicate.
    pub(crate) keepalive_head: String,
    pub(crate) delete_head: String,
    /// Binds: headers, priority, delay, id, delivery id (PostgreSQL then channel, queue).
    pub(crate) reschedule: String,
    pub(crate) list: String,
    pub(crate) find: String,
    pub(crate) count: String,
    /// Milliseconds since the oldest row of the queue was stored (NULL when empty).
    pub(crate) oldest: String,
}

impl Statements {
    fn new(dialect: Dialect, t: &str) -> Self {
        let r = |template: String| dialect.render(&template);
        let claim = match dialect {
            // The picked ids as one array, matched with `= ANY`: the update then always probes
            // the primary key. Joined to the ids as rows, the planner may hash the whole table
            // instead (seen with 1,000-row batches on a 60,000-row table: 27 ms, not 10 ms).
            Dialect::Postgres => format!(
                "WITH picked AS (SELECT ARRAY(SELECT id FROM {t} WHERE queue_name = ? \
                 AND available_at <= {{now}} AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                 ORDER BY priority DESC, available_at, id LIMIT ? FOR UPDATE SKIP LOCKED) AS ids) \
                 UPDATE {t} SET delivered_at = {{now}}, delivery_id = ? FROM picked WHERE {t}.id = ANY(picked.ids) \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
            ),
            // An autocommit write takes SQLite's write lock up front: no two claims overlap.
            Dialect::Sqlite => format!(
                "UPDATE {t} SET delivered_at = {{now}}, delivery_id = ?4 WHERE id IN (\
                 SELECT id FROM {t} WHERE queue_name = ?1 AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - ?2) \
                 ORDER BY priority DESC, available_at, id LIMIT ?3) RETURNING {COLUMNS}"
            ),
            Dialect::Mysql => format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                 ORDER BY priority DESC, available_at, id LIMIT ?{{skip_locked}}"
            ),
        };
        let reschedule_update = format!(
            "UPDATE {t} SET headers = ?, priority = ?, available_at = {{now}} + ?, \
             delivered_at = NULL, delivery_id = NULL WHERE id = ? AND delivery_id = ?"
        );
        let reschedule = if dialect == Dialect::Postgres {
            // The retried message wakes the queue's consumers in the same statement.
            format!(
                "WITH upd AS ({reschedule_update} RETURNING id), wake AS (SELECT pg_notify(?, ?)) \
                 SELECT COUNT(*) FROM upd CROSS JOIN wake"
            )
        } else {
            reschedule_update
        };
        Self {
            // A data-modifying CTE runs whether or not it is read: the acks and the claim go in
            // one round trip and one commit. The rows it deletes were claimed by this worker
            // within the redelivery window, so the claim (which skips those) never sees them.
            delete_and_claim: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "WITH gone AS (DELETE FROM {t} WHERE (id, delivery_id) IN \
                     (SELECT * FROM UNNEST(?::INT8[], ?::INT8[]))), {}",
                    claim.trim_start_matches("WITH ")
                ))
            }),
            claim: r(claim),
            // Two statements, so that a drain started once the first returned takes the rows
            // behind these (see `courier_core::Drain`).
            drain: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "SELECT id FROM {t} WHERE queue_name = ? \
                     AND available_at <= {{now}} AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                     ORDER BY priority DESC, available_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
                ))
            }),
            drain_take: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "DELETE FROM {t} WHERE id IN (SELECT UNNEST(?::INT8[])) RETURNING {COLUMNS}"
                ))
            }),
            next_due: r(format!(
                "SELECT CAST(MIN(CASE WHEN delivered_at IS NULL THEN available_at \
                 ELSE {{greatest}}(available_at, delivered_at + ?) END) - {{now}} AS {{bigint}}) \
                 FROM {t} WHERE queue_name = ?"
            )),
            delete_one: r(format!("DELETE FROM {t} WHERE id = ? AND delivery_id = ?")),
            delete_ids: format!("DELETE FROM {t} WHERE queue_name = ? AND id IN "),
            keepalive: r(format!(
                "UPDATE {t} SET delivered_at = {{now}} WHERE id = ? AND delivery_id = ?"
            )),
            keepalive_head: r(format!("UPDATE {t} SET delivered_at = {{now}}")),
            delete_head: format!("DELETE FROM {t}"),
            reschedule: r(reschedule),
            list: r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? ORDER BY id LIMIT ?"
            )),
            find: r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? AND id = ?"
            )),
            count: r(format!("SELECT COUNT(*) FROM {t} WHERE queue_name = ?")),
            oldest: r(format!(
                "SELECT CAST({{now}} - MIN(created_at) AS {{bigint}}) FROM {t} WHERE queue_name = ?"
            )),
        }
    }
}

/// The statements of a queue with flow control per key (`concurrency_max`, `fair`): rows carry
/// a `concurrency_key`, and the claim ranks the claimable rows per key with a window function.
/// A slot is a delivered row under a live lease (`delivered_at` within the redelivery window):
/// nothing else holds it, so an ack, a retry or an expired lease frees it and none can leak.
#[derive(Debug)]
pub(crate) struct FlowStatements {
    /// SQLite and PostgreSQL: claims in one statement (binds: queue, redelivery window, limit,
    /// delivery id). MySQL: the select of the rows to claim (binds: queue, window, queue,
    /// window, limit); the update follows as in the plain claim.
    pub(crate) claim: String,
    /// A limited queue without `fair`: the same claim ranking only the FIFO head of the
    /// queue ([`HEAD_ROWS`] rows), tried first. A key's rows in the head are its first rows, so
    /// their ranks are exact; when it claims fewer than asked (the head is taken by full keys,
    /// or is all there is), the whole claim runs for the rest, in the same transaction.
    pub(crate) head_claim: Option<String>,
    /// Serialises the claims of the queue across hosts: PostgreSQL, a transaction-scoped
    /// advisory lock (bind: the lock's name); MySQL, a named lock of the session (binds: name,
    /// timeout in seconds). SQLite: `None` (its write lock serialises).
    pub(crate) lock: Option<String>,
    /// MySQL: releases the named lock (bind: name).
    pub(crate) unlock: Option<String>,
    /// The name of the queue's claim lock.
    pub(crate) lock_name: String,
    /// The next due time, leaving out waiting rows of full keys (binds: window, queue, queue,
    /// window); without a limit, the plain statement's.
    pub(crate) next_due: Option<String>,
    /// PostgreSQL: wakes the queue's waiting consumers after an ack freed a slot (binds:
    /// channel, queue).
    pub(crate) notify: Option<String>,
    /// Each key's rows in flight (delivered under a live lease) and queued (ready to deliver,
    /// not under a live lease) (binds: window, window, queue).
    pub(crate) loads: String,
}

/// The rows of a queue's FIFO head that [`FlowStatements::head_claim`] ranks.
const HEAD_ROWS: u32 = 1_000;

impl FlowStatements {
    pub(crate) fn new(dialect: Dialect, t: &str, max: Option<u32>, fair: bool) -> Self {
        let r = |template: String| dialect.render(&template);
        let claimable = "queue_name = ? AND available_at <= {now}                          AND (delivered_at IS NULL OR delivered_at < {now} - ?)";
        // The key's n-th claimable row (FIFO inside a key), and how many of its rows are
        // delivered under a live lease: a row may be claimed while n + busy <= max.
        let full = max.map_or(String::new(), |max| {
            format!(" WHERE (r.concurrency_key IS NULL OR r.rn + COALESCE(b.busy, 0) <= {max})")
        });
        let busy_join = if max.is_some() {
            format!(
                " LEFT JOIN (SELECT concurrency_key, COUNT(*) AS busy FROM {t}                  WHERE queue_name = ? AND concurrency_key IS NOT NULL AND delivered_at >= {{now}} - ?                  GROUP BY concurrency_key) b ON b.concurrency_key = r.concurrency_key"
            )
        } else {
            String::new()
        };
        let order = if fair {
            "r.priority DESC, r.rn, r.available_at, r.id"
        } else {
            "r.priority DESC, r.available_at, r.id"
        };
        let pick_from = |busy_join: &str, rows: &str| {
            format!(
                "SELECT r.id FROM (SELECT id, priority, available_at, concurrency_key,                  ROW_NUMBER() OVER (PARTITION BY concurrency_key ORDER BY priority DESC, available_at, id) AS rn                  FROM {rows}) r{busy_join}{full} ORDER BY {order} LIMIT ?"
            )
        };
        let whole = format!("{t} WHERE {claimable}");
        let head = format!(
            "(SELECT id, priority, available_at, concurrency_key FROM {t} WHERE {claimable}              ORDER BY priority DESC, available_at, id LIMIT {HEAD_ROWS}) h"
        );
        let pick = |busy_join: &str| pick_from(busy_join, &whole);
        // SQLite numbers its binds, so the busy count reuses the queue and the window;
        // PostgreSQL's are written out; MySQL binds them again.
        let numbered = |sql: String, marks: &[&str]| {
            let mut out = String::with_capacity(sql.len());
            let mut n = 0;
            for c in sql.chars() {
                if c == '?' {
                    out.push_str(marks.get(n).copied().unwrap_or("?"));
                    n += 1;
                } else {
                    out.push(c);
                }
            }
            out
        };
        let claim_with = |pick: &dyn Fn(&str) -> String| match dialect {
            Dialect::Sqlite => {
                let marks: &[&str] = if max.is_some() {
                    &["?1", "?2", "?1", "?2", "?3"]
                } else {
                    &["?1", "?2", "?3"]
                };
                r(format!(
                    "UPDATE {t} SET delivered_at = {{now}}, delivery_id = ?4 WHERE id IN ({})                      RETURNING {COLUMNS}",
                    numbered(pick(&busy_join), marks)
                ))
            }
            Dialect::Postgres => {
                let marks: &[&str] = if max.is_some() {
                    &["$1", "$2", "$1", "$2", "$3"]
                } else {
                    &["$1", "$2", "$3"]
                };
                // Under the queue's claim lock, so no other claim counts the same slots; the
                // update checks each row is still claimable (a claim without the lock, of
                // another version, may have taken it).
                r(format!(
                    "WITH picked AS (SELECT ARRAY({}) AS ids)                      UPDATE {t} SET delivered_at = {{now}}, delivery_id = $4 FROM picked                      WHERE {t}.id = ANY(picked.ids) AND ({t}.delivered_at IS NULL OR {t}.delivered_at < {{now}} - $2)                      RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at",
                    numbered(pick(&busy_join), marks)
                ))
            }
            Dialect::Mysql => r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE id IN (SELECT id FROM ({}) p)",
                pick(&busy_join)
            )),
        };
        let claim = claim_with(&pick);
        let head_claim = match (max, dialect) {
            (Some(_), _) if fair => None,
            // PostgreSQL counts the busy slots of the head's keys only (one range of the
            // concurrency index per key), not of every key of the queue.
            (Some(max), Dialect::Postgres) => Some(r(format!(
                "WITH h AS (SELECT id, priority, available_at, concurrency_key FROM {t} \
                 WHERE queue_name = $1 AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - $2) \
                 ORDER BY priority DESC, available_at, id LIMIT {HEAD_ROWS}), \
                 b AS (SELECT concurrency_key, COUNT(*) AS busy FROM {t} WHERE queue_name = $1 \
                 AND concurrency_key IN (SELECT concurrency_key FROM h WHERE concurrency_key IS NOT NULL) \
                 AND delivered_at >= {{now}} - $2 GROUP BY concurrency_key), \
                 picked AS (SELECT ARRAY(SELECT r.id FROM (SELECT h.*, ROW_NUMBER() OVER \
                 (PARTITION BY concurrency_key ORDER BY priority DESC, available_at, id) AS rn FROM h) r \
                 LEFT JOIN b ON b.concurrency_key = r.concurrency_key \
                 WHERE r.concurrency_key IS NULL OR r.rn + COALESCE(b.busy, 0) <= {max} \
                 ORDER BY r.priority DESC, r.available_at, r.id LIMIT $3) AS ids) \
                 UPDATE {t} SET delivered_at = {{now}}, delivery_id = $4 FROM picked \
                 WHERE {t}.id = ANY(picked.ids) AND ({t}.delivered_at IS NULL OR {t}.delivered_at < {{now}} - $2) \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
            ))),
            (Some(_), _) => Some(claim_with(&|busy_join: &str| pick_from(busy_join, &head))),
            (None, _) => None,
        };
        let (lock, unlock) = match dialect {
            Dialect::Sqlite => (None, None),
            Dialect::Postgres => (
                // The transport's sessions plan with `enable_sort = off` (its plain statements
                // walk indexes); ranking per key sorts, so this transaction turns it back on.
                Some(
                    "SELECT set_config('enable_sort', 'on', true), pg_advisory_xact_lock(hashtext($1))"
                        .to_owned(),
                ),
                None,
            ),
            Dialect::Mysql => (
                Some("SELECT GET_LOCK(?, ?)".to_owned()),
                Some("SELECT RELEASE_LOCK(?)".to_owned()),
            ),
        };
        let next_due = max.map(|max| {
            r(format!(
                "SELECT CAST(MIN(CASE WHEN delivered_at IS NULL THEN available_at                  ELSE {{greatest}}(available_at, delivered_at + ?) END) - {{now}} AS {{bigint}})                  FROM {t} WHERE queue_name = ? AND (delivered_at IS NOT NULL OR concurrency_key IS NULL                  OR concurrency_key NOT IN (SELECT concurrency_key FROM {t} WHERE queue_name = ?                  AND concurrency_key IS NOT NULL AND delivered_at >= {{now}} - ?                  GROUP BY concurrency_key HAVING COUNT(*) >= {max}))"
            ))
        });
        Self {
            claim,
            head_claim,
            lock,
            unlock,
            // MySQL lock names are at most 64 characters (a table name is at most 46).
            lock_name: format!("courier_claim:{t}"),
            next_due,
            notify: (dialect == Dialect::Postgres && max.is_some())
                .then(|| "SELECT pg_notify($1, $2)".to_owned()),
            loads: r(format!(
                "SELECT {key}, COUNT(CASE WHEN delivered_at >= {{now}} - ? THEN 1 END), \
                 COUNT(CASE WHEN available_at <= {{now}} AND (delivered_at IS NULL \
                 OR delivered_at < {{now}} - ?) THEN 1 END) \
                 FROM {t} WHERE queue_name = ? AND concurrency_key IS NOT NULL \
                 GROUP BY concurrency_key",
                // MySQL keeps the key as bytes (VARBINARY): read it back as text.
                key = if dialect == Dialect::Mysql {
                    "CAST(concurrency_key AS CHAR)"
                } else {
                    "concurrency_key"
                }
            )),
        }
    }
}

/// The message table of one queue on the database `DB`.
#[derive(Debug)]
pub(crate) struct Messages<DB: MessageDialect> {
    pub(crate) pool: Pool<DB>,
    pub(crate) sql: Statements,
    pub(crate) table: String,
    pub(crate) queue: String,
    pub(crate) redeliver_ms: i64,
    pub(crate) state: DB::State,
    pub(crate) dedup: crate::dedup::DedupStatements,
    /// Flow control per key, when configured.
    pub(crate) flow: Option<FlowStatements>,
}

impl<DB: MessageDialect> Messages<DB> {
    pub(crate) fn new(pool: Pool<DB>, o: &SqlOptions, state: DB::State) -> Self {
        Self {
            pool,
            sql: Statements::new(DB::DIALECT, &o.table_name),
            table: o.table_name.clone(),
            queue: o.queue_name.clone(),
            redeliver_ms: i64::try_from(o.redeliver_timeout.as_millis()).unwrap_or(i64::MAX),
            state,
            dedup: crate::dedup::DedupStatements::new(DB::DIALECT, &o.table_name),
            flow: o.keyed().then(|| {
                FlowStatements::new(DB::DIALECT, &o.table_name, o.concurrency_max, o.fair)
            }),
        }
    }

    /// The pool writes go through (see [`MessageDialect::write_pool`]).
    pub(crate) fn writes(&self) -> &Pool<DB> {
        DB::write_pool(self)
    }

    /// This process's turn to write, where writes take turns.
    async fn write_turn(&self) -> Option<MutexGuard<'_, ()>> {
        match DB::writer(&self.state) {
            Some(writer) => Some(writer.lock().await),
            None => None,
        }
    }
}

/// A pooled connection that may hold MySQL's claim lock (a lock of the session, not of a
/// transaction): dropped while it may (a claim cancelled or failed between `GET_LOCK` and
/// `RELEASE_LOCK`), it leaves the pool and closes, and the server releases the lock, rather than
/// going back to the pool still holding it and stopping every other claim of the queue.
struct SessionGuard<DB: sqlx::Database> {
    conn: Option<sqlx::pool::PoolConnection<DB>>,
    may_hold: bool,
}

impl<DB: sqlx::Database> SessionGuard<DB> {
    fn conn(&mut self) -> Result<&mut DB::Connection, sqlx::Error> {
        self.conn.as_deref_mut().ok_or(sqlx::Error::PoolClosed)
    }
}

impl<DB: sqlx::Database> Drop for SessionGuard<DB> {
    fn drop(&mut self) {
        if self.may_hold
            && let Some(conn) = self.conn.take()
        {
            drop(conn.detach());
        }
    }
}

/// `(delivery_id = ? AND id IN (?, ...)) OR ...`, grouping the pairs by delivery id (a fetched
/// batch shares one); returns the predicate and the values to bind in order.
pub(crate) fn grouped_deliveries(deliveries: &[(i64, i64)]) -> (String, Vec<i64>) {
    let mut groups: Vec<(i64, Vec<i64>)> = Vec::new();
    for &(id, delivery) in deliveries {
        match groups.iter_mut().find(|(d, _)| *d == delivery) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((delivery, vec![id])),
        }
    }
    let mut sql = String::new();
    let mut binds = Vec::with_capacity(deliveries.len() + groups.len());
    for (i, (delivery, ids)) in groups.iter().enumerate() {
        if i > 0 {
            sql.push_str(" OR ");
        }
        let _ = write!(
            sql,
            "(delivery_id = ? AND id IN ({}))",
            vec!["?"; ids.len()].join(", ")
        );
        binds.push(*delivery);
        binds.extend(ids);
    }
    (sql, binds)
}

/// Binds one row of a multi-row insert: queue, body, headers, priority, delay.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_row<'q, DB>(
    q: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    queue: &'q str,
    row: &'q NewRow,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(queue)
        .bind(row.body.as_str())
        .bind(row.headers.as_str())
        .bind(row.priority)
        .bind(row.delay_ms)
}

/// Binds a row's concurrency key (after [`bind_row`], on a keyed queue).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_key<'q, DB>(
    q: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    row: &'q NewRow,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: sqlx::Database,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(row.key.as_deref())
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl<DB> Backend for Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (Option<i64>,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String, i64, i64): sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::workers::Row: sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::schedules::Row: sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::limits::Row: sqlx::FromRow<'r, DB::Row>,
{
    async fn setup(&self) -> Result<Vec<Applied>, sqlx::Error> {
        let mut applied = {
            let _turn = self.write_turn().await;
            migrate::migrate(
                self.writes(),
                &migrate::MESSAGES,
                &[("{messages}", &self.table)],
            )
            .await?
        };
        applied.extend(self.setup_workers().await?);
        let _turn = self.write_turn().await;
        let dedup = crate::dedup::dedup_table(&self.table);
        applied.extend(
            migrate::migrate(self.writes(), &migrate::DEDUP, &[("{dedup}", &dedup)]).await?,
        );
        Ok(applied)
    }

    async fn missing_migrations(&self) -> Result<Vec<migrate::Missing>, sqlx::Error> {
        let workers = crate::workers::workers_table(&self.table);
        let schedules = crate::schedules::schedules_table(&self.table);
        let paused = crate::paused::paused_table(&self.table);
        let limits = crate::limits::limits_table(&self.table);
        let dedup = crate::dedup::dedup_table(&self.table);
        let mut missing = migrate::missing(
            &self.pool,
            &migrate::MESSAGES,
            &[("{messages}", &self.table)],
        )
        .await?;
        missing.extend(
            migrate::missing(&self.pool, &migrate::WORKERS, &[("{workers}", &workers)]).await?,
        );
        missing.extend(
            migrate::missing(
                &self.pool,
                &migrate::SCHEDULES,
                &[
                    ("{schedules}", &schedules),
                    ("{paused}", &paused),
                    ("{limits}", &limits),
                ],
            )
            .await?,
        );
        missing
            .extend(migrate::missing(&self.pool, &migrate::DEDUP, &[("{dedup}", &dedup)]).await?);
        Ok(missing)
    }

    async fn setup_workers(&self) -> Result<Vec<Applied>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let workers = crate::workers::workers_table(&self.table);
        let mut applied =
            migrate::migrate(self.writes(), &migrate::WORKERS, &[("{workers}", &workers)]).await?;
        let schedules = crate::schedules::schedules_table(&self.table);
        applied.extend(
            migrate::migrate(
                self.writes(),
                &migrate::SCHEDULES,
                &[
                    ("{schedules}", &schedules),
                    ("{paused}", &crate::paused::paused_table(&self.table)),
                    ("{limits}", &crate::limits::limits_table(&self.table)),
                ],
            )
            .await?,
        );
        Ok(applied)
    }

    fn pauses(&self, name: &str, queue: &str) -> Box<dyn courier_core::Pausable> {
        Box::new(crate::paused::SqlPause::new(
            self.pool.clone(),
            &crate::paused::paused_table(&self.table),
            name,
            queue,
        ))
    }

    fn limits(&self, name: &str, queue: &str) -> Box<dyn courier_core::RateLimiter> {
        Box::new(crate::limits::SqlLimits::new(
            self.pool.clone(),
            &crate::limits::limits_table(&self.table),
            name,
            queue,
        ))
    }

    fn schedules(&self, name: &str, location: &str) -> Box<dyn courier_core::ScheduleStore> {
        Box::new(crate::schedules::SqlSchedules::new(
            self.pool.clone(),
            &crate::schedules::schedules_table(&self.table),
            name,
            location,
        ))
    }

    fn workers(
        &self,
        name: &str,
        location: &str,
        stale_after: std::time::Duration,
    ) -> Box<dyn courier_core::WorkerRegistry> {
        Box::new(crate::workers::SqlWorkers::new(
            self.pool.clone(),
            &crate::workers::workers_table(&self.table),
            name,
            location,
            stale_after,
        ))
    }

    async fn dedup_take(&self, key: &str, ttl_ms: i64) -> Result<bool, sqlx::Error> {
        let _turn = self.write_turn().await;
        if let Some(clear) = &self.dedup.clear_expired {
            sqlx::query(clear).bind(key).execute(self.writes()).await?;
        }
        let done = sqlx::query(&self.dedup.take)
            .bind(key)
            .bind(ttl_ms)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn dedup_release(&self, key: &str) -> Result<(), sqlx::Error> {
        let _turn = self.write_turn().await;
        sqlx::query(&self.dedup.release)
            .bind(key)
            .execute(self.writes())
            .await
            .map(drop)
    }

    async fn dedup_prune(&self, max: usize) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let done = sqlx::query(&self.dedup.prune)
            .bind(limit(max))
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn insert_keyed(
        &self,
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut tx = self.writes().begin().await?;
        let ids = self.insert_keyed_on(&mut tx, rows, keys).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn insert_keyed_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        // No write turn: the caller's transaction may hold SQLite's write lock already.
        let Some(conn) = conn.downcast_mut::<DB::Connection>() else {
            return Err(sqlx::Error::Configuration(
                format!("the transaction is not on a {:?} connection", DB::DIALECT).into(),
            ));
        };
        self.insert_keyed_on(conn, rows, keys).await
    }

    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut conn = self.writes().acquire().await?;
        DB::insert(self, &mut conn, rows).await
    }

    async fn insert_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error> {
        // No write turn: the caller's transaction may hold SQLite's write lock already.
        let Some(conn) = conn.downcast_mut::<DB::Connection>() else {
            return Err(sqlx::Error::Configuration(
                format!("the transaction is not on a {:?} connection", DB::DIALECT).into(),
            ));
        };
        DB::insert(self, conn, rows).await
    }

    async fn oldest_age_ms(&self) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&self.sql.oldest)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
        let _turn = self.write_turn().await;
        if self.flow.is_some() && DB::DIALECT != Dialect::Sqlite {
            return self.claim_keyed(&[], max, delivery_id).await;
        }
        if DB::DIALECT == Dialect::Mysql {
            // SELECT ... FOR UPDATE SKIP LOCKED, then one UPDATE, in one READ COMMITTED
            // transaction (no gap locks, so claims, inserts and deletes do not deadlock).
            let mut tx = self.writes().begin().await?;
            let rows = self.claim_on(&mut tx, max, delivery_id).await?;
            tx.commit().await?;
            return Ok(rows);
        }
        let mut conn = self.writes().acquire().await?;
        self.claim_on(&mut conn, max, delivery_id).await
    }

    async fn delete_and_claim(
        &self,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error> {
        if deliveries.is_empty() {
            return self.claim(max, delivery_id).await;
        }
        let _turn = self.write_turn().await;
        if self.flow.is_some() && DB::DIALECT != Dialect::Sqlite {
            return self.claim_keyed(deliveries, max, delivery_id).await;
        }
        if let Some(rows) = DB::delete_and_claim(self, deliveries, max, delivery_id).await {
            let mut rows = rows?;
            sort_claimed(&mut rows);
            return Ok(rows);
        }
        // One transaction, one commit (one fsync where commits sync) for both halves: the
        // acks of the last batch and the claim of the next. Either both happen or neither.
        let mut tx = self.writes().begin().await?;
        self.for_deliveries_on(&mut tx, &self.sql.delete_head, deliveries)
            .await?;
        let rows = self.claim_on(&mut tx, max, delivery_id).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn drain(
        &self,
        name: &str,
        max: usize,
        hold_for: std::time::Duration,
        held: &tokio::sync::Notify,
    ) -> Option<Result<(Vec<StoredRow>, Box<dyn crate::relay::DrainHold>), sqlx::Error>> {
        DB::drain(self, name, max, hold_for, held).await
    }

    fn cursor(&self) -> Option<&dyn crate::backend::CursorRows> {
        DB::cursor(self)
    }

    async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
        if let Some(sql) = self.flow.as_ref().and_then(|f| f.next_due.as_ref()) {
            return sqlx::query_scalar(sql)
                .bind(self.redeliver_ms)
                .bind(self.queue.as_str())
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .fetch_one(&self.pool)
                .await;
        }
        sqlx::query_scalar(&self.sql.next_due)
            .bind(self.redeliver_ms)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        self.for_deliveries(&self.sql.delete_head, deliveries).await
    }

    async fn delete_one(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        self.by_id(&self.sql.delete_one, id, delivery_id).await
    }

    async fn delete_ids(&self, ids: &[i64]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut deleted = 0;
        for chunk in ids.chunks(CHUNK) {
            let sql = DB::DIALECT.render(&format!(
                "{}({})",
                self.sql.delete_ids,
                vec!["?"; chunk.len()].join(", ")
            ));
            let mut q = sqlx::query(&sql).bind(self.queue.as_str());
            for id in chunk {
                q = q.bind(*id);
            }
            deleted += DB::rows_affected(&q.execute(self.writes()).await?);
        }
        Ok(deleted)
    }

    async fn keepalive(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        self.by_id(&self.sql.keepalive, id, delivery_id).await
    }

    async fn keepalive_many(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        self.for_deliveries(&self.sql.keepalive_head, deliveries)
            .await
    }

    async fn reschedule(
        &self,
        id: i64,
        delivery_id: i64,
        row: &NewRow,
    ) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        if DB::DIALECT == Dialect::Postgres {
            let (n,): (i64,) = sqlx::query_as(&self.sql.reschedule)
                .bind(row.headers.as_str())
                .bind(row.priority)
                .bind(row.delay_ms)
                .bind(id)
                .bind(delivery_id)
                .bind(self.table.as_str())
                .bind(self.queue.as_str())
                .fetch_one(self.writes())
                .await?;
            return Ok(u64::try_from(n).unwrap_or(0));
        }
        let done = sqlx::query(&self.sql.reschedule)
            .bind(row.headers.as_str())
            .bind(row.priority)
            .bind(row.delay_ms)
            .bind(id)
            .bind(delivery_id)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn list(&self, n: usize) -> Result<Vec<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.sql.list)
            .bind(self.queue.as_str())
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
    }

    async fn find(&self, id: i64) -> Result<Option<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.sql.find)
            .bind(self.queue.as_str())
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    async fn count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.sql.count)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn key_loads(&self) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
        let Some(flow) = &self.flow else {
            return Ok(Vec::new());
        };
        sqlx::query_as(&flow.loads)
            .bind(self.redeliver_ms)
            .bind(self.redeliver_ms)
            .bind(self.queue.as_str())
            .fetch_all(&self.pool)
            .await
    }

    fn start_listener(&self, wake: &Arc<Wake>) {
        DB::start_listener(self, wake);
    }

    async fn slots_freed(&self) -> Result<(), sqlx::Error> {
        if let Some(sql) = self.flow.as_ref().and_then(|f| f.notify.as_ref()) {
            sqlx::query(sql)
                .bind(self.table.as_str())
                .bind(self.queue.as_str())
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    fn connection_ids(&self) -> Vec<u64> {
        DB::connection_ids(self)
    }

    async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
        DB::explain(self, e).await
    }
}

impl<DB> Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// Takes a deduplication key on `conn` (in the caller's transaction): `true` when taken.
    async fn take_key_on(
        &self,
        conn: &mut DB::Connection,
        key: &str,
        ttl_ms: i64,
    ) -> Result<bool, sqlx::Error>
    where
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if let Some(clear) = &self.dedup.clear_expired {
            sqlx::query(clear).bind(key).execute(&mut *conn).await?;
        }
        let done = sqlx::query(&self.dedup.take)
            .bind(key)
            .bind(ttl_ms)
            .execute(&mut *conn)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// Takes the rows' keys, then inserts the rows whose key was free (and those without one),
    /// on `conn`, inside a transaction of the caller's; each row's id, `None` when held.
    async fn insert_keyed_on(
        &self,
        conn: &mut DB::Connection,
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error>
    where
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let mut fresh = Vec::with_capacity(rows.len());
        for i in 0..rows.len() {
            fresh.push(match keys.get(i).copied().flatten() {
                Some((key, ttl_ms)) => self.take_key_on(conn, key, ttl_ms).await?,
                None => true,
            });
        }
        let ids = if fresh.iter().all(|f| *f) {
            DB::insert(self, conn, rows).await?
        } else {
            let kept: Vec<NewRow> = rows
                .iter()
                .zip(&fresh)
                .filter(|(_, f)| **f)
                .map(|(r, _)| r.clone())
                .collect();
            if kept.is_empty() {
                Vec::new()
            } else {
                DB::insert(self, conn, &kept).await?
            }
        };
        let kept = fresh.iter().filter(|f| **f).count();
        if ids.len() != kept {
            return Err(sqlx::Error::Protocol(format!(
                "inserted {} rows for {kept} messages",
                ids.len()
            )));
        }
        let mut ids = ids.into_iter();
        Ok(fresh
            .into_iter()
            .map(|f| if f { ids.next() } else { None })
            .collect())
    }

    /// A statement on one delivery (binds: id, delivery id); returns the rows matched.
    async fn by_id(&self, sql: &str, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let done = sqlx::query(sql)
            .bind(id)
            .bind(delivery_id)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    /// `head WHERE <deliveries>`, chunked, in one transaction when there are several chunks;
    /// returns the rows matched. The caller holds the write turn.
    async fn for_deliveries(
        &self,
        head: &str,
        deliveries: &[(i64, i64)],
    ) -> Result<u64, sqlx::Error> {
        if deliveries.len() > CHUNK {
            let mut tx = self.writes().begin().await?;
            let matched = self.for_deliveries_on(&mut tx, head, deliveries).await?;
            tx.commit().await?;
            return Ok(matched);
        }
        let mut conn = self.writes().acquire().await?;
        self.for_deliveries_on(&mut conn, head, deliveries).await
    }

    /// `head WHERE <deliveries>` on `conn`, in chunks (the dialect's own form when it has one);
    /// returns the rows matched.
    async fn for_deliveries_on(
        &self,
        conn: &mut DB::Connection,
        head: &str,
        deliveries: &[(i64, i64)],
    ) -> Result<u64, sqlx::Error> {
        if let Some(done) = DB::for_deliveries(self, conn, head, deliveries).await {
            return done;
        }
        let mut matched = 0;
        for chunk in deliveries.chunks(CHUNK) {
            let (predicate, binds) = grouped_deliveries(chunk);
            let sql = DB::DIALECT.render(&format!("{head} WHERE {predicate}"));
            let mut q = sqlx::query(&sql);
            for b in binds {
                q = q.bind(b);
            }
            matched += DB::rows_affected(&q.execute(&mut *conn).await?);
        }
        Ok(matched)
    }

    /// MySQL: marks selected rows delivered under `delivery_id`.
    async fn mark_claimed(
        &self,
        conn: &mut DB::Connection,
        rows: &[StoredRow],
        delivery_id: i64,
    ) -> Result<(), sqlx::Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let sql = DB::DIALECT.render(&format!(
            "UPDATE {} SET delivered_at = {{now}}, delivery_id = ? WHERE id IN ({})",
            self.table,
            vec!["?"; rows.len()].join(", ")
        ));
        let mut q = sqlx::query(&sql).bind(delivery_id);
        for r in rows {
            q = q.bind(r.id);
        }
        q.execute(&mut *conn).await?;
        Ok(())
    }

    /// PostgreSQL and MySQL with flow control: deletes `deliveries` and claims in one
    /// transaction under the queue's claim lock, so that no two claims count the same free
    /// slots. PostgreSQL's lock is the transaction's (taken by [`Self::claim_on`], released at
    /// commit); MySQL's is the session's, released only after the commit, so the next claim
    /// reads this one's rows.
    async fn claim_keyed(
        &self,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'r> (Option<i64>,): sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        use sqlx::Connection as _;
        let Some(flow) = &self.flow else {
            return Ok(Vec::new());
        };
        let mut guard = SessionGuard {
            conn: Some(self.writes().acquire().await?),
            may_hold: false,
        };
        let session_lock = flow.unlock.is_some();
        if session_lock && let Some(lock) = &flow.lock {
            // From the moment the lock is asked for: a claim cancelled now must not hand the
            // session back to the pool holding it.
            guard.may_hold = true;
            let (got,): (Option<i64>,) = sqlx::query_as(lock)
                .bind(flow.lock_name.as_str())
                .bind(30_i64)
                .fetch_one(guard.conn()?)
                .await?;
            if got != Some(1) {
                guard.may_hold = false;
                return Err(sqlx::Error::Protocol(format!(
                    "the claim lock `{}` was not granted within 30 s",
                    flow.lock_name
                )));
            }
        }
        let claimed = async {
            let mut tx = guard.conn()?.begin().await?;
            if !deliveries.is_empty() {
                self.for_deliveries_on(&mut tx, &self.sql.delete_head, deliveries)
                    .await?;
                if let Some(notify) = &flow.notify {
                    sqlx::query(notify)
                        .bind(self.table.as_str())
                        .bind(self.queue.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
            }
            let rows = self.claim_on(&mut tx, max, delivery_id).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(rows)
        }
        .await;
        if session_lock && let Some(unlock) = &flow.unlock {
            // On failure the guard closes the session, which releases the lock.
            sqlx::query(unlock)
                .bind(flow.lock_name.as_str())
                .execute(guard.conn()?)
                .await?;
            guard.may_hold = false;
        }
        claimed
    }

    /// Runs one of the flow-control claims (`limited`: it counts the keys' busy slots).
    async fn flow_claim(
        &self,
        conn: &mut DB::Connection,
        claim: &str,
        limited: bool,
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if DB::DIALECT == Dialect::Mysql {
            let mut q = sqlx::query_as(claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms);
            if limited {
                q = q.bind(self.queue.as_str()).bind(self.redeliver_ms);
            }
            let rows: Vec<StoredRow> = q.bind(limit(max)).fetch_all(&mut *conn).await?;
            self.mark_claimed(conn, &rows, delivery_id).await?;
            return Ok(rows);
        }
        sqlx::query_as(claim)
            .bind(self.queue.as_str())
            .bind(self.redeliver_ms)
            .bind(limit(max))
            .bind(delivery_id)
            .fetch_all(&mut *conn)
            .await
    }

    /// Claims up to `max` rows on `conn` (MySQL: the select and the update, in the caller's
    /// transaction); returns them in claim order.
    async fn claim_on(
        &self,
        conn: &mut DB::Connection,
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if let Some(flow) = &self.flow {
            if DB::DIALECT == Dialect::Postgres
                && let Some(lock) = &flow.lock
            {
                sqlx::query(lock)
                    .bind(flow.lock_name.as_str())
                    .execute(&mut *conn)
                    .await?;
            }
            let mut rows = Vec::new();
            if let Some(head) = &flow.head_claim {
                rows = self
                    .flow_claim(conn, head, flow.next_due.is_some(), max, delivery_id)
                    .await?;
            }
            if rows.len() < max {
                let more = self
                    .flow_claim(
                        conn,
                        &flow.claim,
                        flow.next_due.is_some(),
                        max - rows.len(),
                        delivery_id,
                    )
                    .await?;
                rows.extend(more);
            }
            sort_claimed(&mut rows);
            return Ok(rows);
        }
        let mut rows: Vec<StoredRow> = if DB::DIALECT == Dialect::Mysql {
            let rows: Vec<StoredRow> = sqlx::query_as(&self.sql.claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .bind(limit(max))
                .fetch_all(&mut *conn)
                .await?;
            self.mark_claimed(conn, &rows, delivery_id).await?;
            rows
        } else {
            sqlx::query_as(&self.sql.claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .bind(limit(max))
                .bind(delivery_id)
                .fetch_all(&mut *conn)
                .await?
        };
        sort_claimed(&mut rows);
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_deliveries_group_by_delivery() {
        let (sql, binds) = grouped_deliveries(&[(1, 9), (2, 9), (3, 7)]);
        assert_eq!(
            sql,
            "(delivery_id = ? AND id IN (?, ?)) OR (delivery_id = ? AND id IN (?))"
        );
        assert_eq!(binds, vec![9, 1, 2, 7, 3]);
    }

    /// With a backlog of 60,000 rows, neither a 1,000-row claim nor a 1,000-row drain reads
    /// the whole table: both walk the claim index, whether or not the table was analyzed since
    /// it filled. (Joined to the picked ids as rows, the planner hashed the whole table for each
    /// batch; before an `ANALYZE` it guessed a few rows match and sorted all 60,000 per batch:
    /// 19 ms a drain, not 3.)
    #[cfg(feature = "postgres")]
    #[tokio::test]
    #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    async fn a_large_postgres_batch_finds_its_rows_by_index() {
        let url = courier_test::env::postgres_url();
        let table = format!("courier_plan_{}", fastrand::u32(..));
        // Sessions as the transport opens them.
        let options = crate::SqlOptions::default();
        let (pool, _) = crate::pool::postgres_pool(&url, &crate::PoolSettings::from(&options))
            .await
            .expect("postgres");
        let create = crate::migrate::MESSAGES
            .list
            .iter()
            .filter_map(|m| m.template(Dialect::Postgres))
            .map(|t| crate::migrate::render(t, &[("{messages}", &table)]))
            .collect::<String>();
        sqlx::raw_sql(&create)
            .execute(&pool)
            .await
            .expect("the message table");
        sqlx::query(&format!(
            "INSERT INTO {table} (queue_name, body, headers, created_at, available_at) \
             SELECT 'default', repeat('x', 200), '{{}}', 1, 1 FROM generate_series(1, 60000)"
        ))
        .execute(&pool)
        .await
        .expect("the backlog");
        let sql = Statements::new(Dialect::Postgres, &table);
        let (Some(drain), Some(drain_take), Some(delete_and_claim)) =
            (sql.drain, sql.drain_take, sql.delete_and_claim)
        else {
            panic!("postgres drains, and deletes and claims in one statement");
        };
        let acked: Vec<i64> = (1..=1_000).collect();
        let mut failures = Vec::new();
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query(&format!("ANALYZE {table}"))
                    .execute(&pool)
                    .await
                    .expect("analyze");
            }
            for (what, statement) in [
                ("claim", &sql.claim),
                ("delete_and_claim", &delete_and_claim),
                ("drain", &drain),
                ("drain_take", &drain_take),
            ] {
                let explain = format!("EXPLAIN {statement}");
                let mut q = sqlx::query_scalar::<_, String>(&explain);
                if what == "drain_take" {
                    q = q.bind(acked.clone());
                } else {
                    if what == "delete_and_claim" {
                        q = q.bind(acked.clone()).bind(vec![7_i64; acked.len()]);
                    }
                    q = q.bind("default").bind(3_600_000_i64).bind(1_000_i64);
                    if what != "drain" {
                        q = q.bind(8_i64);
                    }
                }
                let plan = q.fetch_all(&pool).await.expect("explain").join("\n");
                if plan.contains("Seq Scan") || plan.contains("Sort Key") {
                    failures.push(format!("{what} (analyzed: {analyzed}):\n{plan}"));
                }
            }
        }
        // The table and the side table its migrations create (0009: the cursors).
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_cursors"))
            .execute(&pool)
            .await;
        assert!(
            failures.is_empty(),
            "a scan or a sort of the whole backlog:\n{}",
            failures.join("\n")
        );
    }

    #[test]
    fn every_statement_binds_in_the_same_order_on_every_dialect() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql] {
            let s = Statements::new(dialect, "t");
            assert!(!s.reschedule.contains("{now}"), "{dialect:?}");
            if dialect == Dialect::Postgres {
                assert!(s.reschedule.contains("headers = $1") && s.reschedule.contains("$7"));
            }
        }
    }
}
