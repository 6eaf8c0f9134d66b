//! [`DoctrineTransport`]: Symfony's Doctrine table `messenger_messages`, read and written as PHP
//! does, so that PHP and Courier workers consume one queue together.

mod list;
#[cfg(feature = "mysql")]
mod mysql;
mod options;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod rows;
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use courier_core::{
    Abilities, Capabilities, DelayStamp, Envelope, MessageRegistry, Transport, TransportError,
    TransportErrorKind, TransportMessageIdStamp,
};

pub use options::DoctrineOptions;
use sql::{Pool, Row};

use crate::SymfonySerializer;

/// Symfony's Doctrine transport on PostgreSQL, SQLite or MariaDB (10.6 or later): PHP and
/// Courier workers consume one queue together.
///
/// - `send` inserts a row as PHP's `Connection::send` does: `created_at` now and `available_at`
///   now plus the `DelayStamp`'s whole seconds, wall-clock in PHP's zone, whole seconds.
/// - `get` claims rows with PHP's predicate (`queue_name`, `delivered_at` null or older than
///   the redelivery horizon, `available_at` due, oldest `available_at` first) by setting
///   `delivered_at`, which is the lease; on PostgreSQL with `FOR UPDATE SKIP LOCKED`, so that it
///   never waits on a row PHP is claiming, while PHP's own `FOR UPDATE` waits on Courier's claim
///   and then finds the row taken. On MariaDB the same in two statements of one transaction
///   (`SELECT ... FOR UPDATE SKIP LOCKED`, then `UPDATE ... SET delivered_at`); a claim the
///   server picks as a deadlock's victim is tried again, then returns nothing that time. A
///   send, an ack or a keepalive refused for a deadlock or a lock wait timeout (PHP's `FOR
///   UPDATE` takes gap locks) is sent again, up to 5 times: the refused statement was rolled
///   back whole.
/// - `keepalive` sets `delivered_at` to now again; `ack` and `reject` delete the row, as PHP does
///   (on MySQL PHP instead sets `delivered_at` to 9999-12-31 and deletes those rows on its next
///   fetch: Courier never claims them, and deletes its own at once).
/// - `retry` sends a new row (with the `RedeliveryStamp` the worker added and a `DelayStamp`),
///   then deletes the old one: what PHP's retry listener does, so either side retries what the
///   other failed, its count intact.
///
/// ```no_run
/// # async fn run() -> Result<(), courier_core::TransportError> {
/// use std::sync::Arc;
/// use courier_core::MessageRegistry;
/// use courier_symfony::{DoctrineOptions, DoctrineTransport, SymfonySerializer, SymfonyTypes};
///
/// let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send"));
/// let transport = DoctrineTransport::connect(
///     "async",
///     "postgres://app@127.0.0.1/app",
///     DoctrineOptions::default().queue_name("default"),
///     serializer,
///     Arc::new(MessageRegistry::new()),
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DoctrineTransport {
    name: String,
    pool: Pool,
    options: DoctrineOptions,
    serializer: SymfonySerializer,
    registry: Arc<MessageRegistry>,
}

impl DoctrineTransport {
    /// Connects to the database at `url` (`postgres://...`, `sqlite:...`, `mysql://...`) and, unless
    /// `auto_setup` is off, creates the table when missing, with the columns PHP's Doctrine
    /// bridge creates.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for a bad table name or an unknown scheme (or one whose
    /// feature is off); the connection or setup error.
    pub async fn connect(
        name: impl Into<String>,
        url: &str,
        options: DoctrineOptions,
        serializer: SymfonySerializer,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        if !options.valid_table() {
            return Err(TransportError::new(TransportErrorKind::Config, name)
                .with_context("table_name must be letters, digits and `_`"));
        }
        let pool = Pool::connect(&name, url).await?;
        let serializer = serializer.with_zone(options.zone);
        let transport = Self {
            name,
            pool,
            options,
            serializer,
            registry,
        };
        if transport.options.auto_setup {
            transport.setup().await?;
        }
        Ok(transport)
    }

    /// Creates the table and its indexes when missing, as PHP's Doctrine bridge lays them out.
    ///
    /// # Errors
    /// The database's error.
    pub async fn setup(&self) -> Result<(), TransportError> {
        self.pool
            .setup(&self.options.table_name)
            .await
            .map_err(|e| self.db_error("creating the table", e))
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &DoctrineOptions {
        &self.options
    }

    /// The transport's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    fn db_error(&self, doing: &'static str, e: sqlx::Error) -> TransportError {
        let kind = match &e {
            sqlx::Error::PoolTimedOut => TransportErrorKind::Timeout,
            sqlx::Error::PoolClosed => TransportErrorKind::Connection,
            // A deadlock, a lock wait timeout, a dropped connection: worth trying again.
            e if courier_sql::is_transient(e) => TransportErrorKind::Connection,
            _ => TransportErrorKind::Protocol,
        };
        TransportError::new(kind, self.name.clone())
            .with_context(doing)
            .with_source(e)
    }

    /// Now and `offset` later as the table holds them: wall-clock in PHP's zone, whole seconds.
    fn wall_clock(&self, at: SystemTime) -> String {
        DateTime::<Utc>::from(at)
            .with_timezone(&self.options.zone)
            .format("%Y-%m-%d %H:%M:%S")
            .to_string()
    }

    fn row_id(&self, envelope: &Envelope) -> Result<i64, TransportError> {
        envelope
            .last::<TransportMessageIdStamp>()
            .and_then(|s| s.0.parse().ok())
            .ok_or_else(|| {
                TransportError::new(TransportErrorKind::NotFound, self.name.clone())
                    .with_context("envelope has no row id (TransportMessageIdStamp)")
            })
    }

    fn decode(&self, row: Row) -> Envelope {
        self.serializer
            .decode(&self.registry, row.body, &row.headers)
            .with(TransportMessageIdStamp(row.id.to_string()))
    }
}

/// The most rows one INSERT takes (5 parameters each, within SQLite's, PostgreSQL's and
/// MariaDB's limits).
const SEND_CHUNK: usize = 1000;

/// When a message sent `now` is due: PHP's `modify(sprintf('%+d seconds', $delay / 1000))`,
/// whole seconds of its `DelayStamp`.
fn available_at(now: SystemTime, envelope: &Envelope) -> SystemTime {
    let delay = envelope
        .last::<DelayStamp>()
        .map_or(0, |DelayStamp(d)| d.as_secs());
    now + Duration::from_secs(delay)
}

#[async_trait]
impl Transport for DoctrineTransport {
    fn messaging_system(&self) -> &'static str {
        self.pool.messaging_system()
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.capabilities().check_delay(&self.name, &envelope)?;
        let wire = self
            .serializer
            .encode(&self.registry, &envelope)
            .map_err(|e| {
                TransportError::new(TransportErrorKind::Encode, self.name.clone()).with_source(e)
            })?;
        let now = SystemTime::now();
        let available = available_at(now, &envelope);
        let id = self
            .pool
            .insert(
                &self.options.table_name,
                &wire.body,
                &wire.headers_json(),
                &self.options.queue_name,
                &self.wall_clock(now),
                &self.wall_clock(available),
            )
            .await
            .map_err(|e| self.db_error("inserting a message", e))?;
        Ok(envelope.with(TransportMessageIdStamp(id.to_string())))
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        let now = SystemTime::now();
        // Most messages are due at once: their `available_at` is `created_at`, written once.
        let created = self.wall_clock(now);
        let mut sent = Vec::with_capacity(envelopes.len());
        for chunk in envelopes.chunks(SEND_CHUNK) {
            let mut rows = Vec::with_capacity(chunk.len());
            for envelope in chunk {
                self.capabilities().check_delay(&self.name, envelope)?;
                let wire = self
                    .serializer
                    .encode(&self.registry, envelope)
                    .map_err(|e| {
                        TransportError::new(TransportErrorKind::Encode, self.name.clone())
                            .with_source(e)
                    })?;
                let headers = wire.headers_json();
                let available = available_at(now, envelope);
                rows.push((
                    wire.body,
                    headers,
                    if available == now {
                        created.clone()
                    } else {
                        self.wall_clock(available)
                    },
                ));
            }
            let ids = self
                .pool
                .insert_many(
                    &self.options.table_name,
                    &rows,
                    &self.options.queue_name,
                    &created,
                )
                .await
                .map_err(|e| self.db_error("inserting messages", e))?;
            sent.extend(
                chunk
                    .iter()
                    .zip(ids)
                    .map(|(e, id)| e.clone().with(TransportMessageIdStamp(id.to_string()))),
            );
        }
        Ok(sent)
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let ids = envelopes
            .iter()
            .map(|e| self.row_id(e))
            .collect::<Result<Vec<_>, _>>()?;
        self.pool
            .delete_many(&self.options.table_name, &ids)
            .await
            .map_err(|e| self.db_error("acking messages", e))
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.ack_and_get(&[], max).await
    }

    /// The acks ride on the claim: one statement on PostgreSQL, one transaction on SQLite.
    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return self.ack_batch(acks).await.map(|()| Vec::new());
        }
        let acked = acks
            .iter()
            .map(|e| self.row_id(e))
            .collect::<Result<Vec<_>, _>>()?;
        let now = SystemTime::now();
        let horizon = now
            .checked_sub(self.options.redeliver_timeout)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut rows = self
            .pool
            .claim(
                &self.options.table_name,
                &self.options.queue_name,
                &self.wall_clock(now),
                &self.wall_clock(horizon),
                max,
                &acked,
            )
            .await
            .map_err(|e| self.db_error("claiming messages", e))?;
        rows.sort_by_key(|r| r.id);
        Ok(rows.into_iter().map(|row| self.decode(row)).collect())
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let id = self.row_id(envelope)?;
        self.pool
            .delete(&self.options.table_name, id)
            .await
            .map_err(|e| self.db_error("acking a message", e))
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let id = self.row_id(envelope)?;
        self.pool
            .delete(&self.options.table_name, id)
            .await
            .map_err(|e| self.db_error("rejecting a message", e))
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let id = self.row_id(envelope)?;
        self.pool
            .touch(
                &self.options.table_name,
                id,
                &self.wall_clock(SystemTime::now()),
            )
            .await
            .map_err(|e| self.db_error("keeping a message alive", e))
    }

    fn abilities(&self) -> Abilities<'_> {
        Abilities::none().listable(self)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_delay(None)
            .with_redeliver_after(self.options.redeliver_timeout)
            .with_ack_with_get()
    }
}
