//! [`SqlTransport`]: the [`Transport`](courier_core::Transport) contract on one table, whatever
//! the dialect. This file holds construction and what every operation shares (retrying a backend
//! call, decoding rows); its parts: `schema.rs` (migrations and the schema check), `send.rs`
//! (rows to insert), `dedup.rs` (deduplication keys), `receive.rs` (claiming within a poll
//! window), `settle.rs` (deleting a delivery), `operations.rs` (the `Transport` contract),
//! `relay_source.rs` (draining and the cursor outbox) and `listing.rs` (listing, counting,
//! other queues).

use std::sync::Arc;

use courier_core::{
    Dsn, Envelope, MessageRegistry, TransportError, TransportErrorKind, TransportMessageIdStamp,
    WorkerRegistry,
};
use tokio::time::Instant;

use crate::backend::{Backend, StoredRow, Wake};
use crate::error::{retry_transient, transport_error};
use crate::relay::{CursorSource, Drain};
use crate::{Dialect, SqlOptions};

mod dedup;
mod listing;
mod operations;
mod receive;
mod relay_source;
mod schema;
mod send;
mod settle;

/// A transport storing messages as rows of one table (`courier_messages` by default) on
/// PostgreSQL, SQLite or MySQL / MariaDB. See the [crate docs](crate) for the behaviour.
pub struct SqlTransport {
    name: String,
    dsn: Dsn,
    options: SqlOptions,
    registry: Arc<MessageRegistry>,
    backend: Box<dyn Backend>,
    wake: Arc<Wake>,
    /// The worker registry beside the table (`<table>_workers`).
    workers: Box<dyn WorkerRegistry>,
    /// The schedule store beside the table (`<table>_schedules`).
    schedules: Box<dyn courier_core::ScheduleStore>,
    /// The queue's pause flag (`<table>_paused`).
    pauses: Box<dyn courier_core::Pausable>,
    /// The queue's rate-limit bucket (`<table>_limits`).
    limits: Box<dyn courier_core::RateLimiter>,
    /// Migrations applied since it connected and not yet reported by `setup_report`.
    applied: std::sync::Mutex<Vec<String>>,
    /// A cursor outbox's: when rows written without `cursor=true` were last looked for.
    strays_checked: std::sync::Mutex<Instant>,
    /// When expired deduplication keys are pruned next.
    dedup_prune: crate::dedup::PruneClock,
    /// Built on the application's pool: the pool and how errors name it (`None`: the
    /// transport's own pool).
    shared_pool: Option<(crate::SqlPool, String)>,
    /// With `auto_setup` off: set once the schema was found complete (or set up here); until
    /// then the first `get` or send checks it (`None`: nothing to check).
    schema_checked: Option<tokio::sync::OnceCell<()>>,
}

impl std::fmt::Debug for SqlTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlTransport")
            .field("name", &self.name)
            .field("dsn", &self.dsn)
            .field("table", &self.options.table_name)
            .field("queue", &self.options.queue_name)
            .finish_non_exhaustive()
    }
}

impl SqlTransport {
    /// Draining ([`Drain`]: on PostgreSQL, but for a cursor outbox), what a relay reads this
    /// queue with.
    #[must_use]
    pub fn as_drain(&self) -> Option<&dyn Drain> {
        // A cursor outbox's rows are the cursor's to delete.
        (matches!(
            Dialect::from_scheme(self.dsn.scheme()),
            Ok(Dialect::Postgres)
        ) && !self.options.cursor)
            .then_some(self as &dyn Drain)
    }

    /// Reading by a cursor ([`CursorSource`]: on PostgreSQL with `cursor=true`), what a relay
    /// reads this queue with, and alone.
    #[must_use]
    pub fn as_cursor(&self) -> Option<&dyn CursorSource> {
        self.backend.cursor().map(|_| self as &dyn CursorSource)
    }

    /// Connects with the options in the DSN's query (see [`SqlOptions::from_dsn`]) and, unless
    /// `auto_setup=false`, creates the table.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for a bad DSN or option (the password redacted), or the
    /// connection / setup error.
    pub async fn connect(
        name: impl Into<String>,
        dsn: &Dsn,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        let options = SqlOptions::from_dsn(dsn).map_err(|e| {
            TransportError::new(TransportErrorKind::Config, name.clone())
                .with_context(e.to_string())
        })?;
        Self::connect_with(name, dsn, options, registry).await
    }

    /// Connects with explicit options (the DSN's own Courier options are ignored; the others go
    /// to the driver).
    ///
    /// # Errors
    /// As [`SqlTransport::connect`].
    pub async fn connect_with(
        name: impl Into<String>,
        dsn: &Dsn,
        options: SqlOptions,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        if let Err(e) = options.check_flow_control() {
            return Err(TransportError::new(TransportErrorKind::Config, name).with_context(e));
        }
        if options.cursor && !matches!(Dialect::from_scheme(dsn.scheme()), Ok(Dialect::Postgres)) {
            return Err(TransportError::new(TransportErrorKind::Config, name).with_context(
                "cursor=true needs PostgreSQL (a cursor outbox orders rows by the id of the transaction that wrote them); on SQLite and MySQL / MariaDB the relay claims or takes rows instead",
            ));
        }
        let backend = crate::connect::backend(&name, dsn, &options).await?;
        Self::assemble(name, dsn.clone(), options, registry, backend, None, true).await
    }

    /// Builds the transport on the application's own pool (see [`SqlPool`](crate::SqlPool)
    /// for what that changes per database), with explicit options (`max_connections`,
    /// `min_connections`, `acquire_timeout` and `busy_timeout` are the pool's own and ignored
    /// here). The transport never closes the pool. Unless `auto_setup` is off, it creates its
    /// tables; with it off, it checks that every migration is recorded and fails naming the
    /// first missing one.
    ///
    /// On PostgreSQL the `LISTEN` that wakes waiting consumers holds one connection of the
    /// pool while the transport lives; [`SqlOptions::listen`]`(false)` makes consumers poll
    /// instead. [`dispatch_in`](crate::dispatch_in) takes a transaction of the same pool.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use courier_core::MessageRegistry;
    /// use courier_sql::{SqlOptions, SqlTransport};
    ///
    /// let options = SqlOptions::default().queue_name("emails").listen(false);
    /// let queue =
    ///     SqlTransport::from_pool("async", pool.clone(), options, Arc::new(MessageRegistry::new()))
    ///         .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for `cursor=true` on another database than PostgreSQL;
    /// the setup (or, `auto_setup` off, the schema check) error.
    pub async fn from_pool(
        name: impl Into<String>,
        pool: impl Into<crate::SqlPool>,
        options: SqlOptions,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        let pool: crate::SqlPool = pool.into();
        let scheme = pool.scheme();
        if options.cursor && pool.dialect() != Dialect::Postgres {
            return Err(TransportError::new(TransportErrorKind::Config, name).with_context(
                "cursor=true needs PostgreSQL (a cursor outbox orders rows by the id of the transaction that wrote them)",
            ));
        }
        let dsn = Dsn::parse(&format!("{scheme}://shared-pool/{name}")).map_err(|e| {
            TransportError::new(TransportErrorKind::Config, name.clone())
                .with_context(e.to_string())
        })?;
        let described = pool.describe();
        let shared = (pool.clone(), described);
        let backend: Box<dyn Backend> = match pool {
            #[cfg(feature = "sqlite")]
            crate::SqlPool::Sqlite(p) => Box::new(crate::sqlite::from_pool(p, &options)),
            #[cfg(feature = "postgres")]
            crate::SqlPool::Postgres(p) => Box::new(crate::postgres::from_pool(p, &options)),
            #[cfg(feature = "mysql")]
            crate::SqlPool::Mysql(p) => Box::new(
                crate::mysql::from_pool(p, &options)
                    .await
                    .map_err(|e| transport_error(&name, "reading the server version", e))?,
            ),
        };
        Self::assemble(name, dsn, options, registry, backend, Some(shared), true).await
    }

    async fn assemble(
        name: String,
        dsn: Dsn,
        options: SqlOptions,
        registry: Arc<MessageRegistry>,
        backend: Box<dyn Backend>,
        shared_pool: Option<(crate::SqlPool, String)>,
        check_schema: bool,
    ) -> Result<Self, TransportError> {
        let location = courier_core::redact(dsn.expose_without_query());
        let auto_setup = options.auto_setup;
        let workers = backend.workers(&name, &location, options.worker_stale_after);
        let schedules = backend.schedules(&name, &location);
        let pauses = backend.pauses(&name, &options.queue_name);
        let limits = backend.limits(&name, &options.queue_name);
        let transport = Self {
            workers,
            schedules,
            pauses,
            limits,
            name,
            dsn,
            options,
            registry,
            backend,
            schema_checked: (check_schema && !auto_setup).then(tokio::sync::OnceCell::new),
            shared_pool,
            wake: Wake::new(),
            applied: std::sync::Mutex::new(Vec::new()),
            strays_checked: std::sync::Mutex::new(Instant::now()),
            dedup_prune: crate::dedup::PruneClock::new(),
        };
        if transport.options.auto_setup {
            transport.migrate().await?;
        }
        if let Some(cursor) = transport.backend.cursor() {
            // Rows of the queue written before it became a cursor outbox.
            let adopted = transport
                .attempt("adopting rows into the cursor outbox", || cursor.adopt())
                .await?;
            if adopted > 0 {
                tracing::info!(transport = %transport.name, rows = adopted,
                    "rows written before the queue became a cursor outbox (or restored from another cluster) now follow the cursor");
            }
        }
        Ok(transport)
    }

    /// The transport's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The options in effect.
    #[must_use]
    pub fn options(&self) -> &SqlOptions {
        &self.options
    }

    /// Server-side ids of the connections this transport has opened (MySQL / MariaDB), so a
    /// test can `KILL` them. Not part of the stable API.
    #[doc(hidden)]
    #[must_use]
    pub fn server_connection_ids(&self) -> Vec<u64> {
        self.backend.connection_ids()
    }

    fn error(&self, context: &'static str, e: sqlx::Error) -> TransportError {
        transport_error(&self.name, context, e)
    }

    /// Runs a backend operation, retrying transient failures; `context` says what was being
    /// done. A pool that timed out waiting for a connection is explained by one direct attempt,
    /// so that a server that went down is named ("connection refused"), not just "timed out".
    async fn attempt<T, F, Fut>(&self, context: &'static str, op: F) -> Result<T, TransportError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let statement = crate::pool::InFlight::start();
        let result = retry_transient(context, op).await;
        statement.done();
        match result {
            Ok(value) => Ok(value),
            Err(sqlx::Error::PoolTimedOut) if self.shared_pool.is_some() => {
                let pool = self.shared_pool.as_ref().map_or("", |(_, d)| d.as_str());
                Err(
                    TransportError::new(TransportErrorKind::Timeout, self.name.clone())
                        .with_context(format!(
                            "{context}: {pool} had no free connection, every attempt timed out \
                             (size it for the application's connections plus the transport's, \
                             the PostgreSQL listener's included)"
                        ))
                        .with_source(sqlx::Error::PoolTimedOut),
                )
            }
            Err(e) => Err(self.error(context, self.backend.explain(e).await)),
        }
    }

    /// Decodes rows. A row whose body or headers do not decode (headers that are not a JSON
    /// object, a body that is not UTF-8 text) gives an undecodable envelope that names the
    /// problem, bound for the failure transport with its bytes kept.
    fn decode_all<'a, I>(&'a self, rows: I) -> impl Iterator<Item = Envelope> + 'a
    where
        I: IntoIterator<Item = StoredRow>,
        I::IntoIter: 'a,
    {
        let mut decoder = self.registry.json_decoder();
        rows.into_iter().map(move |row| {
            decoder
                .decode_bytes(row.body, row.headers.as_deref())
                .with(TransportMessageIdStamp(row.id.to_string()))
        })
    }
}
