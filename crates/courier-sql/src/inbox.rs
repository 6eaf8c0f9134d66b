//! [`Inbox`]: the idempotent consumer. Each handled message's
//! [`MessageIdStamp`] is recorded in a table of the handler's own
//! database, and a message whose id is recorded already is acked without being handled again.
//!
//! Two ways to use it, best together:
//!
//! - as **middleware** on the consuming bus: before a received message is handled, its id is
//!   looked up (recorded: skipped and acked); after its handlers succeeded, the id is recorded.
//!   Alone, this is at least once with duplicates filtered: a crash between the handler's
//!   effect and the record handles the message again.
//! - **inside the handler's transaction**: [`Inbox::claim_in`] inserts the id in the handler's
//!   own transaction, before its side effect; `false` means it was handled already (skip the
//!   effect). The effect and the record commit together: exactly once, even when the worker
//!   dies after the commit and before the ack, or two deliveries run at once (the second
//!   waits on the first's row, then finds it).
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Envelope, Handler, HandlerError, HandlerResultExt, Message, MessageBus};
//! use courier_sql::{Inbox, InboxOptions};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order: i64 }
//! impl Message for OrderPlaced { const NAME: &'static str = "orders.placed"; }
//!
//! struct Ship { pool: sqlx::PgPool, inbox: Inbox<sqlx::Postgres> }
//!
//! #[courier_core::async_trait]
//! impl Handler<OrderPlaced> for Ship {
//!     async fn handle(&self, m: &OrderPlaced, envelope: &Envelope) -> Result<(), HandlerError> {
//!         let mut tx = self.pool.begin().await.recoverable()?;
//!         if !self.inbox.claim_in(&mut tx, envelope).await.recoverable()? {
//!             return Ok(());                                  // handled before
//!         }
//!         sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
//!             .bind(m.order).execute(&mut *tx).await.recoverable()?;
//!         tx.commit().await.recoverable()?;                   // effect + inbox row together
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://app@db/shop").await?;
//! let inbox = Inbox::new(pool.clone(), InboxOptions::new("shop_inbox").consumer("shipping")).await?;
//! let bus = MessageBus::builder()
//!     .middleware(inbox.clone())                              // skips recorded ids
//!     .handler(Ship { pool, inbox })
//!     .build();
//! # let _ = bus; Ok(()) }
//! ```
//!
//! A message without a `MessageIdStamp` (from a producer that sets none) is handled normally and
//! not recorded. Ids are kept for [`InboxOptions::retain`] (default 7 days): a redelivery later
//! than that is handled again. Old ids are deleted every [`InboxOptions::cleanup_every`]
//! records, and by [`Inbox::cleanup`] (call it on a timer if you like).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use courier_core::{
    BusError, Envelope, MessageIdStamp, Middleware, Next, ReceivedStamp, TransportError,
    TransportErrorKind, async_trait,
};
use sqlx::Pool;

use crate::{Dialect, SqlDatabase, invalid_table_name, is_valid_identifier};

/// The longest message id the inbox records, in bytes (the column's size).
pub const MAX_MESSAGE_ID_LEN: usize = 64;

/// How an [`Inbox`] is named and kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxOptions {
    /// The table (checked by [`is_valid_identifier`]); default `courier_inbox`.
    pub table: String,
    /// Who consumes: several consumers may share one table, each with its own ids (default
    /// `default`, at most 190 bytes).
    pub consumer: String,
    /// How long an id is kept (default 7 days).
    pub retain: Duration,
    /// Old ids are deleted after every this many records (default 1,000; 0: never, call
    /// [`Inbox::cleanup`] yourself).
    pub cleanup_every: u64,
}

impl Default for InboxOptions {
    fn default() -> Self {
        Self::new("courier_inbox")
    }
}

impl InboxOptions {
    /// Options for the table `table`, with the defaults.
    #[must_use]
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            consumer: "default".to_owned(),
            retain: Duration::from_secs(7 * 24 * 3600),
            cleanup_every: 1_000,
        }
    }

    /// Sets [`InboxOptions::consumer`].
    #[must_use]
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = consumer.into();
        self
    }

    /// Sets [`InboxOptions::retain`].
    #[must_use]
    pub fn retain(mut self, retain: Duration) -> Self {
        self.retain = retain;
        self
    }

    /// Sets [`InboxOptions::cleanup_every`].
    #[must_use]
    pub fn cleanup_every(mut self, n: u64) -> Self {
        self.cleanup_every = n;
        self
    }
}

struct Inner<DB: SqlDatabase> {
    pool: Pool<DB>,
    options: InboxOptions,
    claim: String,
    seen: String,
    cleanup: String,
    records: AtomicU64,
}

/// An inbox table on the database `DB`; cheap to clone (clones share it). See the
/// [module docs](self).
pub struct Inbox<DB: SqlDatabase> {
    inner: Arc<Inner<DB>>,
}

impl<DB: SqlDatabase> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<DB: SqlDatabase> std::fmt::Debug for Inbox<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("table", &self.inner.options.table)
            .field("consumer", &self.inner.options.consumer)
            .finish_non_exhaustive()
    }
}

fn config_error(reason: String) -> TransportError {
    TransportError::new(TransportErrorKind::Config, "inbox").with_context(reason)
}

impl<DB> Inbox<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    /// An inbox on `pool` (the handler's database), its table created if missing.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for an invalid table or consumer name; the database error
    /// creating the table.
    pub async fn new(pool: Pool<DB>, options: InboxOptions) -> Result<Self, TransportError> {
        let inbox = Self::without_setup(pool, options)?;
        inbox.setup().await?;
        Ok(inbox)
    }

    /// An inbox on `pool` whose table exists already (see [`Inbox::setup`]).
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for an invalid table or consumer name.
    pub fn without_setup(pool: Pool<DB>, options: InboxOptions) -> Result<Self, TransportError> {
        if !is_valid_identifier(&options.table) {
            return Err(config_error(format!(
                "inbox table: {}",
                invalid_table_name(&options.table)
            )));
        }
        if options.consumer.is_empty() || options.consumer.len() > 190 {
            return Err(config_error(
                "inbox consumer: expected 1 to 190 bytes".to_owned(),
            ));
        }
        let t = &options.table;
        let d = DB::DIALECT;
        let claim = match d {
            Dialect::Mysql => format!(
                "INSERT IGNORE INTO {t} (consumer, message_id, handled_at) VALUES (?, ?, {{now}})"
            ),
            _ => format!(
                "INSERT INTO {t} (consumer, message_id, handled_at) VALUES (?, ?, {{now}}) \
                 ON CONFLICT DO NOTHING"
            ),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                claim: d.render(&claim),
                seen: d.render(&format!(
                    "SELECT COUNT(*) FROM {t} WHERE consumer = ? AND message_id = ?"
                )),
                cleanup: d.render(&format!(
                    "DELETE FROM {t} WHERE consumer = ? AND handled_at < {{now}} - ?"
                )),
                pool,
                options,
                records: AtomicU64::new(0),
            }),
        })
    }

    /// Creates the table if missing (migration `0008`, recorded in `<table>_migrations`).
    ///
    /// # Errors
    /// The database failed.
    pub async fn setup(&self) -> Result<(), TransportError> {
        crate::migrate::migrate(
            &self.inner.pool,
            &crate::migrate::INBOX,
            &[("{inbox}", &self.inner.options.table)],
        )
        .await
        .map(drop)
        .map_err(|e| crate::error::transport_error("inbox", "creating the inbox table", e))
    }

    /// Records the envelope's message id inside the caller's transaction, before the handler's
    /// side effect: `true` when it is new (go on; it commits with your effect), `false` when it
    /// was recorded already (handled before: skip the effect). A concurrent claim of the same
    /// id waits for the first transaction and then answers `false`. An envelope without a
    /// [`MessageIdStamp`] gets `true` and records nothing.
    ///
    /// # Errors
    /// The database error (the transaction is then unusable: roll it back and fail the
    /// message, to be retried); a message id longer than [`MAX_MESSAGE_ID_LEN`] is a
    /// `Configuration` error.
    pub async fn claim_in(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        envelope: &Envelope,
    ) -> Result<bool, sqlx::Error> {
        let Some(id) = envelope.last::<MessageIdStamp>() else {
            return Ok(true);
        };
        let fresh = self.claim_on(&mut **tx, &id.0).await?;
        if fresh {
            self.count_record().await;
        }
        Ok(fresh)
    }

    /// Records `id` on the inbox's own pool: `true` when it is new.
    ///
    /// # Errors
    /// As [`Inbox::claim_in`].
    pub async fn record(&self, id: &str) -> Result<bool, sqlx::Error> {
        let mut conn = self.inner.pool.acquire().await?;
        let fresh = self.claim_on(&mut conn, id).await?;
        if fresh {
            self.count_record().await;
        }
        Ok(fresh)
    }

    /// Whether `id` is recorded.
    ///
    /// # Errors
    /// The database failed.
    pub async fn is_recorded(&self, id: &str) -> Result<bool, sqlx::Error> {
        let (n,): (i64,) = sqlx::query_as(&self.inner.seen)
            .bind(self.inner.options.consumer.as_str())
            .bind(id)
            .fetch_one(&self.inner.pool)
            .await?;
        Ok(n > 0)
    }

    /// Deletes this consumer's ids older than [`InboxOptions::retain`]; returns how many.
    ///
    /// # Errors
    /// The database failed.
    pub async fn cleanup(&self) -> Result<u64, sqlx::Error> {
        let retain_ms = i64::try_from(self.inner.options.retain.as_millis()).unwrap_or(i64::MAX);
        let done = sqlx::query(&self.inner.cleanup)
            .bind(self.inner.options.consumer.as_str())
            .bind(retain_ms)
            .execute(&self.inner.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn claim_on(&self, conn: &mut DB::Connection, id: &str) -> Result<bool, sqlx::Error> {
        if id.len() > MAX_MESSAGE_ID_LEN {
            return Err(sqlx::Error::Configuration(
                format!(
                    "message id of {} bytes exceeds the inbox's {MAX_MESSAGE_ID_LEN}",
                    id.len()
                )
                .into(),
            ));
        }
        let done = sqlx::query(&self.inner.claim)
            .bind(self.inner.options.consumer.as_str())
            .bind(id)
            .execute(conn)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// Every `cleanup_every` records, deletes the expired ids (best effort).
    async fn count_record(&self) {
        let every = self.inner.options.cleanup_every;
        let n = self.inner.records.fetch_add(1, Ordering::Relaxed) + 1;
        if every > 0 && n.is_multiple_of(every) {
            match self.cleanup().await {
                Ok(gone) => {
                    tracing::debug!(courier.inbox.table = %self.inner.options.table, gone, "inbox cleanup")
                }
                Err(e) => {
                    tracing::warn!(courier.inbox.table = %self.inner.options.table, error = %e, "inbox cleanup failed")
                }
            }
        }
    }
}

/// Skips received messages whose id is recorded; records the id of each handled one.
#[async_trait]
impl<DB> Middleware for Inbox<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        if !envelope.has::<ReceivedStamp>() {
            return next.run(envelope).await;
        }
        let Some(id) = envelope.last::<MessageIdStamp>().map(|s| s.0.clone()) else {
            return next.run(envelope).await;
        };
        if self
            .is_recorded(&id)
            .await
            .map_err(|e| BusError::Middleware(Box::new(e)))?
        {
            tracing::debug!(courier.message.id = %id, "inbox: already handled, skipped");
            return Ok(envelope);
        }
        let handled = next.run(envelope).await?;
        if let Err(e) = self.record(&id).await {
            tracing::warn!(courier.message.id = %id, error = %e,
                "inbox: handled but not recorded; a redelivery would be handled again");
        }
        Ok(handled)
    }
}
