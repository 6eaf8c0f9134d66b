//! [`SqlTransport`]: the [`Transport`] contract on one table, whatever the dialect.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    Backoff, Capabilities, Deduplicate, DeduplicateStamp, DeduplicatedStamp, DelayStamp,
    DeliveryTagStamp, Dsn, Envelope, Listable, MessageCount, MessageRegistry, PriorityStamp,
    Queues, SentStamp, Setup, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp, WorkerRegistry, async_trait,
};
use tokio::time::Instant;

use crate::backend::{Backend, NewRow, StoredRow, Wake};
use crate::error::{retry_transient, transport_error};
use crate::migrate::Applied;
use crate::relay::{CursorLease, CursorPosition, CursorSource, Drain, Drained};
use crate::{Dialect, SqlOptions};

/// The longest pause between two polls of an idle queue when no server push is available.
const MAX_IDLE_BACKOFF: Duration = Duration::from_millis(250);
/// The first pause of an idle poll.
const FIRST_IDLE_BACKOFF: Duration = Duration::from_millis(5);
/// How long an empty `get` with live server push waits for a wake-up before it reads the next
/// due time (one statement).
const LISTEN_GRACE: Duration = Duration::from_millis(5);

/// The state of one poll window: its end, the wake-ups seen, the idle backoff.
struct PollWindow {
    deadline: Instant,
    changes: tokio::sync::watch::Receiver<u64>,
    idle: courier_core::Attempts,
    grace_spent: bool,
}

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

/// How often a busy cursor outbox's reads look for rows written without `cursor=true` (an idle
/// one looks once per empty poll window).
const STRAYS_EVERY: Duration = Duration::from_secs(60);

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

    /// Applies the messages migrations not yet recorded for this table (creating it on a fresh
    /// database); returns those it recorded, oldest first (empty when up to date).
    ///
    /// # Errors
    /// The database failed.
    pub async fn migrate(&self) -> Result<Vec<Applied>, TransportError> {
        let applied = self
            .attempt("migrating the messages table", || self.backend.setup())
            .await?;
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(applied.iter().map(ToString::to_string));
        if let Some(checked) = &self.schema_checked {
            let _ = checked.set(());
        }
        for migration in &applied {
            tracing::info!(
                messaging.destination.name = %self.name,
                courier.sql.table = %self.options.table_name,
                courier.sql.migration = %migration,
                "applied migration"
            );
        }
        Ok(applied)
    }

    /// Connects only the worker registry of the table the DSN names (`<table>_workers`), and
    /// creates its table if missing: where workers register when no transport of theirs has a
    /// registry (a RabbitMQ-only configuration whose run store is SQL). The message table is not
    /// created.
    ///
    /// # Errors
    /// As [`SqlTransport::connect`].
    pub async fn connect_worker_registry(
        name: impl Into<String>,
        dsn: &Dsn,
    ) -> Result<Arc<dyn WorkerRegistry>, TransportError> {
        let name = name.into();
        let options = SqlOptions::from_dsn(dsn)
            .map_err(|e| {
                TransportError::new(TransportErrorKind::Config, name.clone())
                    .with_context(e.to_string())
            })?
            .auto_setup(false);
        let backend = crate::connect::backend(&name, dsn, &options).await?;
        let transport = Self::assemble(
            name.clone(),
            dsn.clone(),
            options,
            Arc::new(MessageRegistry::new()),
            backend,
            None,
            false,
        )
        .await?;
        transport.migrate_workers().await?;
        courier_core::shared_worker_registry(Arc::new(transport)).ok_or_else(|| {
            TransportError::new(TransportErrorKind::Config, name).with_context("no worker registry")
        })
    }

    /// Applies the worker registry's migrations not yet recorded (`<table>_workers`); returns
    /// those it recorded. [`SqlTransport::migrate`] does it too.
    ///
    /// # Errors
    /// The database failed.
    pub async fn migrate_workers(&self) -> Result<Vec<Applied>, TransportError> {
        self.attempt("migrating the workers table", || {
            self.backend.setup_workers()
        })
        .await
    }

    /// With `auto_setup` off, checks once that every migration of the message table and the
    /// tables beside it is recorded: a schema the application's own migrations did not bring
    /// up to date is a [`TransportErrorKind::Config`] error naming the first missing
    /// migration, never a table created behind its back.
    ///
    /// # Errors
    /// A migration is missing, or the database failed.
    pub async fn check_schema(&self) -> Result<(), TransportError> {
        let Some(checked) = &self.schema_checked else {
            return Ok(());
        };
        checked
            .get_or_try_init(|| async {
                let missing = self
                    .attempt("checking the schema (auto_setup is off)", || {
                        self.backend.missing_migrations()
                    })
                    .await?;
                match missing.first() {
                    None => Ok(()),
                    Some(first) => Err(TransportError::new(
                        TransportErrorKind::Config,
                        self.name.clone(),
                    )
                    .with_context(format!(
                        "the schema of table `{}` is missing or older than this Courier and \
                         auto_setup is off: {first}{} (run `courier setup`, or apply the SQL of \
                         `courier setup --print-sql` with your migration tool)",
                        self.options.table_name,
                        if missing.len() > 1 {
                            format!(", and {} more", missing.len() - 1)
                        } else {
                            String::new()
                        }
                    ))),
                }
            })
            .await
            .map(|&()| ())
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

    fn new_row(&self, envelope: &Envelope, delay: Duration) -> Result<NewRow, TransportError> {
        let encoded =
            courier_core::encode_json_with(envelope, self.options.serializer).map_err(|e| {
                TransportError::new(TransportErrorKind::Encode, self.name.clone())
                    .with_context("encoding")
                    .with_source(e)
            })?;
        Ok(NewRow {
            body: encoded.body,
            headers: encoded.headers,
            priority: i16::from(envelope.last::<PriorityStamp>().map_or(0, |p| p.0)),
            delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 4),
            key: None,
        })
    }

    /// A message's concurrency key on a queue with flow control: its
    /// [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp) (checked again: 1 to 200
    /// bytes), else the body field `concurrency_key` names. A message whose field is missing
    /// or not a string is refused, naming the path and the message.
    fn concurrency_key(
        &self,
        envelope: &Envelope,
        body: &str,
    ) -> Result<Option<String>, TransportError> {
        if !self.options.keyed() {
            return Ok(None);
        }
        let refuse = |reason: String| {
            TransportError::new(TransportErrorKind::Encode, self.name.clone())
                .with_context(format!("message {}: {reason}", envelope.message_name()))
        };
        if let Some(stamp) = envelope.last::<courier_core::ConcurrencyKeyStamp>() {
            let key = courier_core::ConcurrencyKeyStamp::new(stamp.as_str())
                .map_err(|e| refuse(e.to_string()))?;
            return Ok(Some(String::from(key)));
        }
        match &self.options.concurrency_key {
            Some(path) => path
                .find(body)
                .map(|key| Some(String::from(key)))
                .map_err(refuse),
            None => Ok(None),
        }
    }

    /// The rows of envelopes to insert (delay and priority from their stamps).
    fn rows(&self, envelopes: &[Envelope]) -> Result<Vec<NewRow>, TransportError> {
        let caps = self.capabilities();
        let mut rows = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            caps.check_delay(&self.name, envelope)?;
            let delay = envelope
                .last::<DelayStamp>()
                .map_or(Duration::ZERO, |d| d.0);
            let mut row = self.new_row(envelope, delay)?;
            row.key = self.concurrency_key(envelope, &row.body)?;
            rows.push(row);
        }
        Ok(rows)
    }

    /// The envelopes with the ids their rows got.
    fn with_ids(
        &self,
        envelopes: Vec<Envelope>,
        ids: Vec<i64>,
    ) -> Result<Vec<Envelope>, TransportError> {
        if ids.len() != envelopes.len() {
            return Err(
                TransportError::new(TransportErrorKind::Protocol, self.name.clone()).with_context(
                    format!(
                        "inserted {} rows for {} messages",
                        ids.len(),
                        envelopes.len()
                    ),
                ),
            );
        }
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .map(|(e, id)| e.with(TransportMessageIdStamp(id.to_string())))
            .collect())
    }

    /// The dialect of the DSN.
    fn dialect(&self) -> Option<Dialect> {
        Dialect::from_scheme(self.dsn.scheme()).ok()
    }

    /// Writes envelopes as rows of this transport's table and queue through the caller's
    /// transaction, so that they exist exactly when it commits: the same insert as
    /// [`send_batch`](Transport::send_batch), on the caller's connection (the transaction may
    /// come from any pool on the same database). Returns them with their row ids. Nothing is
    /// retried here (a failed statement spoils the transaction: the caller decides); on
    /// PostgreSQL the consumers' wake-up `NOTIFY` is delivered at commit. Prefer
    /// [`dispatch_in`](crate::dispatch_in), which routes the message first.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] when the transaction is on another kind of database than
    /// this transport's; an encoding error; the database error.
    pub async fn send_in<DB>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        envelopes: Vec<Envelope>,
    ) -> Result<Vec<Envelope>, TransportError>
    where
        DB: crate::SqlDatabase,
        DB::Connection: 'static,
    {
        if self.dialect() != Some(DB::DIALECT) {
            return Err(
                TransportError::new(TransportErrorKind::Config, self.name.clone()).with_context(
                    format!(
                        "a {:?} transaction cannot write to this transport's `{}` database",
                        DB::DIALECT,
                        self.dsn.scheme()
                    ),
                ),
            );
        }
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        let rows = self.rows(&envelopes)?;
        let conn: &mut DB::Connection = tx;
        if let Some(keys) = self.dedup_keys(&envelopes)? {
            let ids = self
                .backend
                .insert_keyed_in(conn, &rows, &key_refs(&keys))
                .await
                .map_err(|e| {
                    self.error(
                        "inserting messages and taking their deduplication keys in a transaction",
                        e,
                    )
                })?;
            if ids.iter().any(Option::is_some) {
                self.wake.bump();
            }
            return self.with_keyed_ids(envelopes, ids, &keys);
        }
        let ids = self
            .backend
            .insert_in(conn, &rows)
            .await
            .map_err(|e| self.error("inserting messages in a transaction", e))?;
        self.wake.bump();
        self.with_ids(envelopes, ids)
    }

    /// The deduplication key and TTL (ms) of each envelope's
    /// [`DeduplicateStamp`](courier_core::DeduplicateStamp); `None` when no envelope has one.
    fn dedup_keys(&self, envelopes: &[Envelope]) -> Result<Option<Vec<Key>>, TransportError> {
        if !envelopes.iter().any(|e| e.has::<DeduplicateStamp>()) {
            return Ok(None);
        }
        let mut keys = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let Some(stamp) = envelope.last::<DeduplicateStamp>() else {
                keys.push(None);
                continue;
            };
            self.check_key(&stamp.key)?;
            let ttl_ms = i64::try_from(stamp.ttl.as_millis()).unwrap_or(i64::MAX / 4);
            keys.push(Some((stamp.key.clone(), ttl_ms)));
        }
        Ok(Some(keys))
    }

    /// Refuses a key longer than the table holds.
    fn check_key(&self, key: &str) -> Result<(), TransportError> {
        if key.len() > crate::dedup::MAX_KEY_BYTES {
            return Err(
                TransportError::new(TransportErrorKind::Unsupported, self.name.clone())
                    .with_context(format!(
                        "deduplication key of {} bytes exceeds the maximum of {}",
                        key.len(),
                        crate::dedup::MAX_KEY_BYTES
                    )),
            );
        }
        Ok(())
    }

    /// The envelopes with the ids their rows got; those whose key was held get a
    /// [`DeduplicatedStamp`] instead, naming the transport they were sent to (their last
    /// [`SentStamp`], else this transport's name).
    fn with_keyed_ids(
        &self,
        envelopes: Vec<Envelope>,
        ids: Vec<Option<i64>>,
        keys: &[Key],
    ) -> Result<Vec<Envelope>, TransportError> {
        if ids.len() != envelopes.len() {
            return Err(
                TransportError::new(TransportErrorKind::Protocol, self.name.clone()).with_context(
                    format!(
                        "inserted {} rows for {} messages",
                        ids.len(),
                        envelopes.len()
                    ),
                ),
            );
        }
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .zip(keys)
            .map(|((e, id), key)| match (id, key) {
                (Some(id), _) => e.with(TransportMessageIdStamp(id.to_string())),
                (None, key) => {
                    let transport = e
                        .last::<SentStamp>()
                        .map_or_else(|| self.name.clone(), |s| s.transport.clone());
                    let key = key.as_ref().map(|(k, _)| k.clone()).unwrap_or_default();
                    tracing::debug!(courier.dedup.key = %key, transport = %transport,
                        "duplicate message not sent");
                    e.with(DeduplicatedStamp { key, transport })
                }
            })
            .collect())
    }

    /// Deletes a bounded pass of expired deduplication keys when one is due (see the `dedup`
    /// module); a failure is logged and the next pass waits its interval.
    async fn prune_keys_when_due(&self) {
        let Some(turn) = self.dedup_prune.turn() else {
            return;
        };
        match self.backend.dedup_prune(crate::dedup::PRUNE_BATCH).await {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(transport = %self.name, keys = n, "expired deduplication keys pruned");
                }
                turn.pruned(n);
            }
            Err(e) => {
                tracing::debug!(transport = %self.name, error = %e,
                    "could not prune expired deduplication keys");
            }
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

    /// The (id, delivery id) of an envelope this transport delivered.
    fn delivery(envelope: &Envelope) -> (Option<i64>, Option<i64>) {
        let id = envelope
            .last::<TransportMessageIdStamp>()
            .and_then(|s| s.0.parse().ok());
        let delivery = envelope
            .last::<DeliveryTagStamp>()
            .and_then(|s| s.0.parse().ok());
        (id, delivery)
    }

    /// [`Transport::get`], deleting `acks` in the first claim's transaction.
    async fn get_after(
        &self,
        max: usize,
        mut acks: Vec<(i64, i64)>,
    ) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if self.options.cursor {
            // A claim would take rows from under the cursor: the relay would skip them, and
            // the claimed ones would never be relayed.
            return Err(TransportError::new(TransportErrorKind::Unsupported, self.name.clone())
                .with_context("a cursor outbox (cursor=true) is read by `courier relay`, not by workers: consume the relay's destination, or open the queue without cursor=true"));
        }
        self.prune_keys_when_due().await;
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let claimed = self.claim_once(max, &acks).await?;
            acks.clear();
            if !claimed.is_empty() || !self.wait_for_more(&mut window).await? {
                return Ok(claimed);
            }
        }
    }

    /// The poll window of one `get` (or drain), starting now.
    fn poll_window(&self) -> PollWindow {
        self.backend.start_listener(&self.wake);
        PollWindow {
            deadline: Instant::now() + self.options.poll_window,
            changes: self.wake.version.subscribe(),
            idle: Backoff::new(FIRST_IDLE_BACKOFF, MAX_IDLE_BACKOFF).attempts(),
            grace_spent: false,
        }
    }

    /// After an empty claim: waits until a row may be claimable (a wake-up, the next due time,
    /// an idle step); `false` once the window is over.
    async fn wait_for_more(&self, w: &mut PollWindow) -> Result<bool, TransportError> {
        let now = Instant::now();
        if now >= w.deadline {
            return Ok(false);
        }
        let remaining = w.deadline - now;
        if self.wake.is_listening() && !w.grace_spent {
            // Server push is live: a message sent now wakes us by NOTIFY. The next due time
            // (a delayed row, an expired delivery) costs a statement, read only when no
            // wake-up comes within the grace: on a busy queue the next message usually
            // does, and the read would delay its claim. A row coming due meanwhile is
            // claimed at most the grace late.
            w.grace_spent = true;
            tokio::select! {
                () = tokio::time::sleep(LISTEN_GRACE.min(remaining)) => {}
                _ = w.changes.changed() => return Ok(true),
            }
            if Instant::now() >= w.deadline {
                return Ok(true);
            }
        }
        let remaining = w.deadline.saturating_duration_since(Instant::now());
        let due = self
            .attempt("reading the next due time", || self.backend.next_due_in())
            .await?;
        let until_due = due.map(|ms| Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0)));
        let wait = if self.wake.is_listening() && until_due.is_none_or(|d| !d.is_zero()) {
            // Server push is live: sleep until the next row is due, woken early by a NOTIFY.
            until_due.map_or(remaining, |d| d.min(remaining))
        } else {
            let step = w.idle.failed();
            until_due
                .filter(|d| !d.is_zero())
                .map_or(step, |d| d.min(step))
                .min(remaining)
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = w.changes.changed() => {}
        }
        Ok(true)
    }

    /// One claim; `acks` (id, delivery id) are deleted in the same transaction first.
    async fn claim_once(
        &self,
        max: usize,
        acks: &[(i64, i64)],
    ) -> Result<Vec<Envelope>, TransportError> {
        let delivery_id = fastrand::i64(1..i64::MAX);
        let rows = if acks.is_empty() {
            self.attempt("claiming messages", || self.backend.claim(max, delivery_id))
                .await?
        } else {
            self.attempt("deleting and claiming messages", || {
                self.backend.delete_and_claim(acks, max, delivery_id)
            })
            .await?
        };
        // One tag for the whole claim: every row of it shares the delivery id.
        let tag = Arc::new(DeliveryTagStamp(delivery_id.to_string()));
        Ok(self
            .decode_all(rows)
            .map(|envelope| envelope.with_arc(Arc::clone(&tag)))
            .collect())
    }

    /// After acks deleted `deleted` delivered rows of a queue with a concurrency limit: their
    /// slots are free, so waiting consumers are woken (this process's at once, other
    /// processes' by `NOTIFY` on PostgreSQL; on SQLite and MySQL they poll).
    async fn slots_freed(&self, deleted: u64) {
        if deleted == 0 || self.options.concurrency_max.is_none() {
            return;
        }
        self.wake.bump();
        if let Err(e) = self.backend.slots_freed().await {
            tracing::debug!(transport = %self.name, error = %e,
                "could not wake other consumers after an ack; they find the free slot at their next poll");
        }
    }

    async fn remove_delivery(
        &self,
        envelope: &Envelope,
        verb: &'static str,
    ) -> Result<(), TransportError> {
        let deleted = match Self::delivery(envelope) {
            (Some(id), Some(delivery)) => {
                let deleted = self
                    .attempt("deleting a message", || {
                        self.backend.delete_one(id, delivery)
                    })
                    .await?;
                self.slots_freed(deleted).await;
                deleted
            }
            (Some(id), None) => {
                self.attempt("deleting a message", || {
                    self.backend.delete_ids(std::slice::from_ref(&id))
                })
                .await?
            }
            (None, _) => {
                tracing::debug!(messaging.destination.name = %self.name, "{verb} of an envelope without a transport id: nothing to delete");
                return Ok(());
            }
        };
        if deleted == 0 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                messaging.message.id = envelope.id().unwrap_or_default(),
                "{verb} deleted nothing: already gone, or the delivery was superseded by a redelivery"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl Transport for SqlTransport {
    fn messaging_system(&self) -> &'static str {
        match Dialect::from_scheme(self.dsn.scheme()) {
            Ok(Dialect::Postgres) => "postgresql",
            Ok(Dialect::Mysql) => "mysql",
            _ => "sqlite",
        }
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let mut sent = self.send_batch(vec![envelope]).await?;
        sent.pop()
            .ok_or_else(|| TransportError::new(TransportErrorKind::Protocol, self.name.clone()))
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        self.check_schema().await?;
        let rows = self.rows(&envelopes)?;
        if let Some(keys) = self.dedup_keys(&envelopes)? {
            // The keys are taken in the insert's transaction: a key exists exactly when its
            // message does, whatever happens to this send.
            let refs = key_refs(&keys);
            let ids = self
                .attempt(
                    "inserting messages and taking their deduplication keys",
                    || self.backend.insert_keyed(&rows, &refs),
                )
                .await?;
            if ids.iter().any(Option::is_some) {
                self.wake.bump();
            }
            self.prune_keys_when_due().await;
            return self.with_keyed_ids(envelopes, ids, &keys);
        }
        let ids = self
            .attempt("inserting messages", || self.backend.insert(&rows))
            .await?;
        self.wake.bump();
        self.with_ids(envelopes, ids)
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.check_schema().await?;
        self.get_after(max, Vec::new()).await
    }

    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        let mut pairs = Vec::with_capacity(acks.len());
        for envelope in acks {
            match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => pairs.push((id, delivery)),
                _ => self.ack(envelope).await?,
            }
        }
        if max == 0 {
            if !pairs.is_empty() {
                let deleted = self
                    .attempt("deleting messages", || self.backend.delete(&pairs))
                    .await?;
                self.slots_freed(deleted).await;
            }
            return Ok(Vec::new());
        }
        self.get_after(max, pairs).await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_delivery(envelope, "ack").await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_delivery(envelope, "reject").await
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let mut pairs = Vec::with_capacity(envelopes.len());
        // Envelopes with an id and no delivery (a drained batch resent by the relay): one
        // statement for all of them.
        let mut ids = Vec::new();
        for envelope in envelopes {
            match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => pairs.push((id, delivery)),
                (Some(id), None) => ids.push(id),
                (None, _) => self.ack(envelope).await?,
            }
        }
        if !ids.is_empty() {
            self.attempt("deleting messages", || self.backend.delete_ids(&ids))
                .await?;
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let deleted = self
            .attempt("deleting messages", || self.backend.delete(&pairs))
            .await?;
        self.slots_freed(deleted).await;
        if deleted < pairs.len() as u64 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                acked = pairs.len(),
                deleted,
                "some acks deleted nothing: already gone, or superseded by a redelivery"
            );
        }
        Ok(())
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let (id, delivery) = Self::delivery(&envelope);
        let next = envelope.clone().without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        let (Some(id), Some(delivery)) = (id, delivery) else {
            // Not one of our deliveries: at least once by the provided send-then-ack.
            self.send(next).await?;
            return self.ack(&envelope).await;
        };
        let row = self.new_row(&next, delay)?;
        let updated = self
            .attempt("rescheduling a message", || {
                self.backend.reschedule(id, delivery, &row)
            })
            .await?;
        if updated == 0 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                messaging.message.id = id,
                "retry updated nothing: the delivery was superseded by a redelivery, which now owns the message"
            );
        }
        self.wake.bump();
        Ok(())
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if let (Some(id), Some(delivery)) = Self::delivery(envelope) {
            let n = self
                .attempt("refreshing a delivery", || {
                    self.backend.keepalive(id, delivery)
                })
                .await?;
            if n == 0 {
                tracing::debug!(messaging.destination.name = %self.name, messaging.message.id = id, "keepalive of a delivery that is no longer live");
            }
        }
        Ok(())
    }

    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let pairs: Vec<(i64, i64)> = envelopes
            .iter()
            .filter_map(|envelope| match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => Some((id, delivery)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return Ok(());
        }
        let live = self
            .attempt("refreshing deliveries", || {
                self.backend.keepalive_many(&pairs)
            })
            .await?;
        if live < pairs.len() as u64 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                held = pairs.len(),
                live,
                "some kept-alive deliveries are no longer live"
            );
        }
        Ok(())
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.listable = Some(self);
        abilities.message_count = Some(self);
        abilities.queues = Some(self);
        abilities.any = Some(self);
        abilities.worker_registry = Some(&*self.workers);
        abilities.deduplicate = Some(self);
        abilities.schedule_store = Some(&*self.schedules);
        abilities.pausable = Some(&*self.pauses);
        abilities.relay_source = {
            (self.as_cursor().is_some() || self.as_drain().is_some())
                .then_some(self as &dyn courier_core::relay::RelaySource)
        };
        abilities.rate_limiter = Some(&*self.limits);
        abilities.keyed_queue = self
            .options
            .keyed()
            .then_some(self as &dyn courier_core::KeyedQueue);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::none()
            .with_delay(None)
            .with_priority()
            .with_get_wait(self.options.poll_window)
            .with_redeliver_after(self.options.redeliver_timeout);
        // PostgreSQL deletes and claims in one statement: the acks of one batch ride on the
        // claim of the next. Elsewhere it takes a transaction of its own, slower than the two
        // statements overlapped, so the worker keeps them apart. On SQLite even the two
        // statements in one call are slower: riding on the acks, the next claim waits for the
        // batch to finish instead of being fetched ahead.
        if matches!(
            Dialect::from_scheme(self.dsn.scheme()),
            Ok(Dialect::Postgres)
        ) {
            caps.with_ack_with_get()
        } else {
            caps
        }
    }
}

/// PostgreSQL: what a relay reads an outbox with (one delete per row, held in a transaction
/// until the destination confirmed).
#[async_trait]
impl Drain for SqlTransport {
    async fn drain(
        &self,
        max: usize,
        hold_for: Duration,
        held: &tokio::sync::Notify,
    ) -> Result<Drained, TransportError> {
        // Like `get_after`, with the drain statements.
        if max == 0 {
            return Ok(Drained::empty());
        }
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let (rows, hold) = self
                .attempt("draining messages", || async {
                    self.backend
                        .drain(&self.name, max, hold_for, held)
                        .await
                        .unwrap_or_else(|| {
                            Err(sqlx::Error::Configuration(
                                "draining needs PostgreSQL".into(),
                            ))
                        })
                })
                .await?;
            if !rows.is_empty() {
                return Ok(Drained::new(self.decode_all(rows).collect(), hold));
            }
            // Nothing held: dropping the hold rolls its empty transaction back.
            drop(hold);
            if !self.wait_for_more(&mut window).await? {
                return Ok(Drained::empty());
            }
        }
    }
}

#[async_trait]
impl CursorSource for SqlTransport {
    async fn acquire(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Box<dyn CursorLease>>, TransportError> {
        let Some(cursor) = self.backend.cursor() else {
            return Err(not_a_cursor(&self.name));
        };
        let taken = self
            .attempt("taking the outbox cursor", || cursor.acquire(owner, lease))
            .await?;
        Ok(taken.map(|(session, (major, minor))| {
            Box::new(SqlCursorLease {
                name: self.name.clone(),
                session,
                position: CursorPosition { major, minor },
            }) as Box<dyn CursorLease>
        }))
    }

    async fn read(
        &self,
        after: CursorPosition,
        max: usize,
    ) -> Result<(Vec<Envelope>, CursorPosition), TransportError> {
        let Some(cursor) = self.backend.cursor() else {
            return Err(not_a_cursor(&self.name));
        };
        if max == 0 {
            return Ok((Vec::new(), after));
        }
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let rows = self
                .attempt("reading the outbox", || {
                    cursor.read((after.major, after.minor), max)
                })
                .await?;
            if !rows.is_empty() && self.strays_due() {
                self.adopt_strays(cursor).await;
            }
            if let Some((last, tx, _)) = rows.last() {
                let to = CursorPosition {
                    major: *tx,
                    minor: last.id,
                };
                let (rows, delays): (Vec<StoredRow>, Vec<i64>) =
                    rows.into_iter().map(|(row, _, left)| (row, left)).unzip();
                let envelopes = self
                    .decode_all(rows)
                    .zip(delays)
                    .map(|(envelope, left)| {
                        // What is left of the delay goes on to the destination; a delay that
                        // ran out is served.
                        let envelope = envelope.without_all::<DelayStamp>();
                        match u64::try_from(left) {
                            Ok(ms) if ms > 0 => {
                                envelope.with(DelayStamp(Duration::from_millis(ms)))
                            }
                            _ => envelope,
                        }
                    })
                    .collect();
                return Ok((envelopes, to));
            }
            // Nothing past the cursor yet, or only rows of transactions newer than one still
            // running: wait for a wake-up (a NOTIFY on insert) or the next idle step.
            let now = Instant::now();
            if now >= window.deadline {
                self.adopt_strays(cursor).await;
                return Ok((Vec::new(), after));
            }
            let step = window.idle.failed().min(window.deadline - now);
            tokio::select! {
                () = tokio::time::sleep(step) => {}
                _ = window.changes.changed() => {}
            }
        }
    }
}

impl SqlTransport {
    /// Whether a busy cursor outbox's read should look for strays ([`STRAYS_EVERY`]).
    fn strays_due(&self) -> bool {
        self.strays_checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
            >= STRAYS_EVERY
    }

    /// Once a cursor outbox's read found nothing for a whole poll window: adopts rows that
    /// reached the queue without a transaction id (written by a producer whose DSN lacks
    /// `cursor=true`), which the cursor would never read. Best effort: tried again next time.
    async fn adopt_strays(&self, cursor: &dyn crate::backend::CursorRows) {
        *self
            .strays_checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        match cursor.adopt().await {
            Ok(0) => {}
            Ok(rows) => tracing::warn!(transport = %self.name, rows,
                "rows reached the cursor outbox without a transaction id (does a producer's DSN lack cursor=true?); they follow the cursor now"),
            Err(e) => tracing::debug!(transport = %self.name, error = %e,
                "adopting rows written without cursor=true failed"),
        }
    }
}

/// A cursor outbox's cursor, held by the session of [`CursorSource::acquire`]. Its calls are
/// not retried: an error may mean the session ended, and with it the lease.
struct SqlCursorLease {
    name: String,
    session: Box<dyn crate::backend::CursorSession>,
    position: CursorPosition,
}

#[async_trait]
impl CursorLease for SqlCursorLease {
    fn position(&self) -> CursorPosition {
        self.position
    }

    async fn advance(&mut self, to: CursorPosition) -> Result<(), TransportError> {
        let from = (self.position.major, self.position.minor);
        self.session
            .advance(from, (to.major, to.minor))
            .await
            .map_err(|e| match e {
                // Transient: the relay takes the cursor again and goes on from where it
                // stands now.
                sqlx::Error::RowNotFound => TransportError::new(
                    TransportErrorKind::Connection,
                    self.name.clone(),
                )
                .with_context(format!(
                    "the outbox cursor is no longer at {}.{} where this relay left it (reset by hand?): taking it again",
                    from.0, from.1
                )),
                e => transport_error(&self.name, "moving the outbox cursor", e),
            })?;
        self.position = to;
        Ok(())
    }

    async fn renew(&mut self) -> Result<(), TransportError> {
        self.session
            .renew()
            .await
            .map_err(|e| transport_error(&self.name, "renewing the outbox cursor's session", e))
    }
}

/// The error of a cursor call on a queue that is not a cursor outbox.
fn not_a_cursor(name: &str) -> TransportError {
    TransportError::new(TransportErrorKind::Unsupported, name.to_owned())
        .with_context("not a cursor outbox (cursor=true on PostgreSQL)")
}

#[async_trait]
impl Setup for SqlTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        self.migrate().await.map(drop)
    }

    /// Migrates, and names every migration applied since this transport connected (its
    /// auto-setup included), oldest first.
    async fn setup_report(&self) -> Result<Vec<String>, TransportError> {
        self.migrate().await?;
        Ok(std::mem::take(
            &mut *self
                .applied
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }

    /// [`SqlTransport::check_schema`].
    async fn check(&self) -> Result<(), TransportError> {
        self.check_schema().await
    }
}

#[async_trait]
impl Listable for SqlTransport {
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError> {
        let rows = self
            .attempt("listing messages", || self.backend.list(limit))
            .await?;
        Ok(self.decode_all(rows).collect())
    }

    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        let row = self
            .attempt("finding a message", || self.backend.find(id))
            .await?;
        Ok(self.decode_all(row).next())
    }

    async fn remove(&self, id: &str) -> Result<bool, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(false);
        };
        let n = self
            .attempt("removing a message", || {
                self.backend.delete_ids(std::slice::from_ref(&id))
            })
            .await?;
        Ok(n > 0)
    }
}

/// Keys in `<table>_dedup` (see the `dedup` module): at most 190 bytes. The bus leaves the key
/// of a message sent here to the send itself ([`takes_keys_on_send`](Deduplicate::takes_keys_on_send)),
/// which takes it in the insert's transaction; [`deduplicate`](Deduplicate::deduplicate) takes one
/// alone (for messages sent elsewhere, with this transport as a bus's store).
#[async_trait]
impl Deduplicate for SqlTransport {
    async fn deduplicate(&self, key: &str, ttl: Duration) -> Result<bool, TransportError> {
        self.check_key(key)?;
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4);
        let taken = self
            .attempt("taking a deduplication key", || {
                self.backend.dedup_take(key, ttl_ms)
            })
            .await?;
        self.prune_keys_when_due().await;
        Ok(taken)
    }

    fn takes_keys_on_send(&self) -> bool {
        true
    }

    async fn release(&self, key: &str) -> Result<(), TransportError> {
        self.attempt("releasing a deduplication key", || {
            self.backend.dedup_release(key)
        })
        .await
    }
}

#[async_trait]
impl MessageCount for SqlTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        let n = self
            .attempt("counting messages", || self.backend.count())
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// From the oldest row's `created_at` and the database clock.
    async fn oldest_age(&self) -> Result<Option<Duration>, TransportError> {
        let ms = self
            .attempt("reading the oldest message's age", || {
                self.backend.oldest_age_ms()
            })
            .await?;
        Ok(ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }
}

/// A keyed queue's loads: one `GROUP BY concurrency_key` over the queue's rows.
#[async_trait]
impl courier_core::KeyedQueue for SqlTransport {
    async fn key_loads(&self, top: usize) -> Result<courier_core::KeyLoads, TransportError> {
        let rows = self
            .attempt("reading the concurrency keys", || self.backend.key_loads())
            .await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let loads = rows
            .into_iter()
            .map(|(key, in_flight, queued)| courier_core::KeyLoad {
                key,
                in_flight: count(in_flight),
                queued: count(queued),
            })
            .collect();
        Ok(courier_core::KeyLoads::top(
            self.options.concurrency_max,
            loads,
            top,
        ))
    }
}

/// The deduplication key and TTL (ms) of one envelope to insert, if it has one.
type Key = Option<(String, i64)>;

/// The keys as the backend takes them.
fn key_refs(keys: &[Key]) -> Vec<Option<(&str, i64)>> {
    keys.iter()
        .map(|k| k.as_ref().map(|(key, ttl)| (key.as_str(), *ttl)))
        .collect()
}

/// Another `queue_name` of the same table, on a pool of its own (`consume --queues`); the table
/// is already set up by this transport.
#[async_trait]
impl Queues for SqlTransport {
    async fn queue(&self, queue: &str) -> Result<Arc<dyn Transport>, TransportError> {
        if queue.is_empty() || queue.len() > 190 {
            return Err(
                TransportError::new(TransportErrorKind::Config, self.name.clone())
                    .with_context("invalid queue name: expected 1 to 190 bytes"),
            );
        }
        let options = self.options.clone().queue_name(queue).auto_setup(false);
        let view = match &self.shared_pool {
            Some((pool, _)) => {
                Self::from_pool(
                    self.name.clone(),
                    pool.clone(),
                    options,
                    self.registry.clone(),
                )
                .await?
            }
            None => {
                Self::connect_with(self.name.clone(), &self.dsn, options, self.registry.clone())
                    .await?
            }
        };
        Ok(Arc::new(view))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A queue whose first claim finds nothing and whose second finds one row, counting the
    /// next-due reads; it reports server push as live.
    #[derive(Debug, Default)]
    struct OneLate {
        claims: AtomicUsize,
        due_reads: AtomicUsize,
    }

    #[async_trait]
    impl Backend for Arc<OneLate> {
        async fn setup(&self) -> Result<Vec<Applied>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn dedup_take(&self, _: &str, _: i64) -> Result<bool, sqlx::Error> {
            Ok(true)
        }
        async fn dedup_release(&self, _: &str) -> Result<(), sqlx::Error> {
            Ok(())
        }
        async fn dedup_prune(&self, _: usize) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn insert_keyed(
            &self,
            _: &[NewRow],
            _: &[Option<(&str, i64)>],
        ) -> Result<Vec<Option<i64>>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert_keyed_in(
            &self,
            _: &mut (dyn std::any::Any + Send),
            _: &[NewRow],
            _: &[Option<(&str, i64)>],
        ) -> Result<Vec<Option<i64>>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert(&self, _: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert_in(
            &self,
            _: &mut (dyn std::any::Any + Send),
            _: &[NewRow],
        ) -> Result<Vec<i64>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn oldest_age_ms(&self) -> Result<Option<i64>, sqlx::Error> {
            Ok(None)
        }
        async fn claim(&self, _: usize, _: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
            if self.claims.fetch_add(1, Ordering::SeqCst) == 0 {
                return Ok(Vec::new());
            }
            Ok(vec![StoredRow {
                id: 1,
                body: b"{}".to_vec(),
                headers: None,
                priority: 0,
                available_at: 0,
            }])
        }
        async fn delete_and_claim(
            &self,
            _: &[(i64, i64)],
            max: usize,
            delivery_id: i64,
        ) -> Result<Vec<StoredRow>, sqlx::Error> {
            self.claim(max, delivery_id).await
        }
        async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
            self.due_reads.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
        async fn delete(&self, _: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn delete_one(&self, _: i64, _: i64) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn delete_ids(&self, _: &[i64]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn keepalive(&self, _: i64, _: i64) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn keepalive_many(&self, _: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn reschedule(&self, _: i64, _: i64, _: &NewRow) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn list(&self, _: usize) -> Result<Vec<StoredRow>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn find(&self, _: i64) -> Result<Option<StoredRow>, sqlx::Error> {
            Ok(None)
        }
        async fn count(&self) -> Result<i64, sqlx::Error> {
            Ok(0)
        }
        fn start_listener(&self, wake: &Arc<Wake>) {
            wake.set_listening(true);
        }
        fn connection_ids(&self) -> Vec<u64> {
            Vec::new()
        }
        async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
            e
        }
        fn workers(&self, _: &str, _: &str, _: Duration) -> Box<dyn courier_core::WorkerRegistry> {
            Box::new(courier_core::InMemoryWorkerRegistry::new())
        }
        async fn setup_workers(&self) -> Result<Vec<Applied>, sqlx::Error> {
            Ok(Vec::new())
        }
        fn schedules(&self, _: &str, _: &str) -> Box<dyn courier_core::ScheduleStore> {
            Box::new(courier_core::InMemoryScheduleStore::new())
        }
        fn pauses(&self, _: &str, _: &str) -> Box<dyn courier_core::Pausable> {
            Box::new(crate::paused::NeverPaused)
        }
        fn limits(&self, _: &str, _: &str) -> Box<dyn courier_core::RateLimiter> {
            Box::new(courier_core::MemoryRateLimiter::new())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_listening_get_woken_soon_after_an_empty_claim_reads_no_next_due_time() {
        let backend = Arc::new(OneLate::default());
        let transport = SqlTransport {
            name: "t".to_owned(),
            dsn: Dsn::parse("postgres://localhost/db").unwrap(),
            options: SqlOptions::default(),
            registry: Arc::new(MessageRegistry::new()),
            backend: Box::new(backend.clone()),
            workers: Box::new(courier_core::InMemoryWorkerRegistry::new()),
            schedules: Box::new(courier_core::InMemoryScheduleStore::new()),
            pauses: Box::new(crate::paused::NeverPaused),
            limits: Box::new(courier_core::MemoryRateLimiter::new()),
            wake: Wake::new(),
            applied: std::sync::Mutex::new(Vec::new()),
            strays_checked: std::sync::Mutex::new(Instant::now()),
            dedup_prune: crate::dedup::PruneClock::new(),
            shared_pool: None,
            schema_checked: None,
        };
        let wake = transport.wake.clone();
        let notify = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            wake.bump();
        };
        let (got, ()) = tokio::join!(transport.get(1), notify);
        assert_eq!(got.unwrap().len(), 1);
        assert_eq!(backend.claims.load(Ordering::SeqCst), 2);
        // The NOTIFY came within the grace: the claim it triggers is not queued behind a read.
        assert_eq!(backend.due_reads.load(Ordering::SeqCst), 0);
    }
}
