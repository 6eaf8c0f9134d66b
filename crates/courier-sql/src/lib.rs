//! Courier's SQL transport: messages as rows of one table on PostgreSQL, SQLite or
//! MySQL / MariaDB (sqlx, runtime queries), Symfony's Doctrine transport without its known
//! defects.
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Dsn, Envelope, Message, MessageRegistry, Transport};
//! use courier_sql::SqlTransport;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u32 }
//! impl Message for Ping { const NAME: &'static str = "app.ping"; }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Arc::new(MessageRegistry::new().with::<Ping>());
//! let dsn = Dsn::parse("sqlite://courier.db?queue_name=async")?;
//! let queue = SqlTransport::connect("async", &dsn, registry).await?;   // creates the table
//! queue.send(Envelope::new(Ping { n: 1 })).await?;
//! for envelope in queue.get(32).await? {                                  // claims up to 32
//!     assert_eq!(envelope.message::<Ping>().map(|p| p.n), Some(1));
//!     queue.ack(&envelope).await?;                                        // deletes the row
//! }
//! # Ok(()) }
//! ```
//!
//! # Table and migrations
//!
//! One table, `courier_messages` by default: `id`, `queue_name`, `body` (the message JSON),
//! `headers` (a JSON object of string -> string), `priority`, and `created_at`, `available_at`,
//! `delivered_at` as epoch milliseconds **from the database clock** (one representation on every
//! dialect), plus `delivery_id`. The DDL lives in `migrations/messages/{postgres,sqlite,mysql}/0001_*.sql`,
//! templates in which `{messages}` stands for the table name: `setup()`
//! ([`SqlTransport::migrate`]) applies those not yet recorded in `<table>_migrations`, under a
//! per-table setup lock (see [`migrate`]). The table name is checked by [`is_valid_identifier`]
//! when the options are read, so nothing else can reach the SQL.
//! `setup()` is idempotent; `auto_setup` (default on) runs it on connect.
//!
//! Beside it, the worker registry ([`WorkerRegistry`](courier_core::WorkerRegistry), for
//! `courier workers` and `courier stop-workers`): `<table>_workers` ([`workers_table`]:
//! `courier_messages` -> `courier_workers`, migration `0005`, recorded in
//! `<workers>_migrations`), one row per running worker with its heartbeat from the database
//! clock; rows older than `worker_stale_after` (default 30 s) are pruned when listed.
//! [`SqlTransport::connect_worker_registry`] opens it alone (a run store's database).
//! The schedule store ([`ScheduleStore`](courier_core::ScheduleStore), for `[schedules]`):
//! `<table>_schedules` ([`schedules_table`], migration `0006`), one row per schedule with its
//! lease and last fired tick; paused queues ([`Pausable`](courier_core::Pausable), for
//! `courier pause`): `<table>_paused` ([`paused_table`], migration `0007`), both recorded in
//! `<schedules>_migrations` and created with the worker registry's table; rate-limit buckets
//! ([`RateLimiter`](courier_core::RateLimiter), for `rate_limit` on a transport):
//! `<table>_limits` ([`limits_table`], migration `0008`, recorded there too), one row per queue
//! taken from by one upsert on the database clock.
//! On PostgreSQL, a queue opened with `cursor=true` is a cursor outbox ([`SqlOptions::cursor`],
//! migration `0009`): its rows record the transaction that wrote them (`relay_tx`, in a partial
//! index that other queues' rows stay out of), and `<table>_cursors` holds each such queue's
//! cursor and the lease of the relay reading it.
//!
//! # The application's pool and migrations
//!
//! [`SqlTransport::from_pool`] runs on a pool the application opened ([`SqlPool`]; never
//! closed by Courier; see there for what changes per database), and [`SqlPoolFactory`] lets a
//! configuration name it (`pool://NAME`). [`migrate::transport_script`] renders the whole DDL of
//! a table and those beside it, with their version rows, for the application's migration tool
//! (`courier setup --print-sql`); with `auto_setup=false` the first `get` or send checks that
//! every migration is recorded ([`SqlTransport::check_schema`]).
//!
//! # Behaviour
//!
//! - `get(max)` claims up to `max` rows in one statement or transaction: PostgreSQL
//!   `WITH picked AS (SELECT ARRAY(SELECT id ... FOR UPDATE SKIP LOCKED)) UPDATE ... WHERE id =
//!   ANY(picked.ids) RETURNING` (the ids as one array, so the update probes the primary key
//!   however large the batch and the backlog); MariaDB / MySQL 8
//!   `SELECT ... FOR UPDATE SKIP LOCKED` + `UPDATE` in one READ COMMITTED transaction; SQLite one
//!   `UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING` (it takes the write lock up front).
//!   Order: priority descending, then `available_at`, then id. Each claim stamps a fresh random
//!   `delivery_id`, returned as [`DeliveryTagStamp`](courier_core::DeliveryTagStamp).
//! - A row delivered more than `redeliver_timeout` (default 30 s) ago and not acked is claimable
//!   again; `keepalive` refreshes `delivered_at`, and the worker keeps every row it holds alive,
//!   so only a dead worker's rows wait the window out.
//! - `ack`/`reject` delete by id **and** delivery id: the late ack of a superseded delivery
//!   deletes nothing (a debug log says so). `ack_batch` is one DELETE, `send_batch` one
//!   multi-row INSERT, `retry` one UPDATE (new headers, new `available_at`, delivery cleared).
//! - Transient errors (serialization failure, deadlock, lock timeout, `SQLITE_BUSY`, connection
//!   loss) are retried inside the transport with capped, jittered exponential backoff.
//! - `get` waits up to `poll_window` (default 1 s) for a message. PostgreSQL: senders
//!   `pg_notify` the table's channel (payload: the queue), and a waiting consumer blocks on a
//!   notification or a timer for the next `available_at`; if the listener connection drops it
//!   polls until the listener is back. SQLite and MySQL: polling with an adaptive backoff (5 ms
//!   doubling to 250 ms), also capped by the next `available_at`; sends from the same process
//!   wake waiting consumers at once.
//! - MySQL: sqlx connects with `CLIENT_FOUND_ROWS`, so affected rows are rows matched.
//! - A `queue_name=failed` transport on the same table is a failure transport: it is
//!   [`Listable`](courier_core::Listable) and counts exactly.
//!
//! # Options (DSN query)
//!
//! See [`SqlOptions`]: `table_name`, `queue_name`, `redeliver_timeout`, `auto_setup`,
//! `poll_window`, `max_connections`, `min_connections`, `acquire_timeout`, `busy_timeout`
//! (SQLite), `worker_stale_after` (the worker registry's), `serializer` (`json` or `msgpack`),
//! `listen` (PostgreSQL: `false` polls instead of holding a connection for `LISTEN`), `cursor`
//! (PostgreSQL: a cursor outbox), and `concurrency_max`, `concurrency_key`, `fair` (flow
//! control per key). Other query options go to the driver (`sslmode`, `application_name`,
//! ...); unknown ones are an error naming them. The password never appears in errors or logs.

// Without a database feature there is no driver: what would use one is left unused (a crate that
// depends on this one for its types alone still builds).
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(unused, unreachable_code)
)]

mod backend;
mod connect;
mod dedup;
mod dialect;
mod error;
mod factory;
pub mod inbox;
mod limits;
mod messages;
pub mod migrate;
#[cfg(feature = "mysql")]
mod mysql;
mod options;
pub mod outbox;
mod paused;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
pub mod relay;
mod schedules;
mod shared;
#[cfg(feature = "sqlite")]
mod sqlite;
mod transport;
mod workers;

pub use dialect::{
    Dialect, MAX_TABLE_NAME_LEN, UnknownDialect, invalid_table_name, is_valid_identifier,
};
pub use error::{is_transient, retry_transient};
pub use factory::{SqlPoolFactory, SqlTransportFactory};
pub use inbox::{Inbox, InboxOptions, MAX_MESSAGE_ID_LEN};
pub use limits::limits_table;
pub use options::{DEFAULT_TABLE, KeyPath, SqlOptions};
pub use outbox::dispatch_in;
pub use paused::paused_table;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use pool::explain_timeout;
#[cfg(feature = "postgres")]
pub use pool::postgres_pool;
#[cfg(feature = "mysql")]
pub use pool::{ConnectionIds, mysql_pool};
pub use pool::{InFlight, PoolSettings, SqlDatabase};
#[cfg(feature = "sqlite")]
pub use pool::{sqlite_pool, sqlite_write_turn, sqlite_writer_pool};
pub use schedules::schedules_table;
pub use shared::SqlPool;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteCheckpoints, sqlite_inserted_ids, sqlite_writes};
pub use transport::SqlTransport;
pub use workers::workers_table;
