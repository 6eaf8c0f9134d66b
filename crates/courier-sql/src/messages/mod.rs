//! The message table on any dialect: one executor generic over the sqlx driver, running the
//! statements of [`Statements`] (one template each, rendered per dialect and table). What truly
//! differs per dialect (inserting, batch predicates over PostgreSQL arrays, `LISTEN`, MySQL's
//! connection ids) is a [`MessageDialect`] hook, in `sqlite.rs`, `postgres.rs` and `mysql.rs`.
//!
//! Its parts: `statements.rs` (the plain queue's statements), `flow.rs` (a queue with flow
//! control per key), `executor.rs` (the [`Backend`](crate::backend::Backend) contract on the
//! table), `insert.rs` (binding and inserting rows), `deliveries.rs` (statements on a batch of
//! deliveries) and `claim.rs` (claiming rows).

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::Pool;
use tokio::sync::{Mutex, MutexGuard};

use crate::backend::{NewRow, StoredRow, Wake};
use crate::{SqlDatabase, SqlOptions};

mod claim;
mod deliveries;
mod executor;
pub(crate) mod flow;
mod insert;
mod statements;

pub(crate) use flow::FlowStatements;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use insert::{bind_key, bind_row};
pub(crate) use statements::Statements;

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

    /// A flow-control claim of the dialect's own: deletes these deliveries (the acks of the
    /// last batch) and claims up to `max` rows under the queue's claim lock; `None`: the caller
    /// runs them in a transaction, a statement at a time.
    async fn flow_claim(
        _m: &Messages<Self>,
        _deliveries: &[(i64, i64)],
        _max: usize,
        _delivery_id: i64,
    ) -> Option<Result<Vec<StoredRow>, sqlx::Error>> {
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

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
