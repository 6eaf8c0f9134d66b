//! [`RedisTransport`]: construction and the shared connection. Its parts: `send.rs` (adding
//! sends to a pipeline), `settle.rs` (acking and rejecting deliveries), `deliver.rs` (turning read
//! entries into envelopes) and `operations.rs` (the [`Transport`](courier_core::Transport)
//! contract).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use courier_core::{
    DeliveryTagStamp, EncodeError, MessageRegistry, TransportError, TransportErrorKind,
};
use redis::{Client, IntoConnectionInfo, RedisError};
use tokio::time::Instant;

use crate::RedisOptions;
use crate::in_flight::InFlight;
use crate::link::{Link, has_code, is_connection_error, is_server_busy};
use crate::reader::Reader;
use crate::scripts::Scripts;

mod deliver;
mod operations;
mod send;
mod settle;

pub(crate) use settle::is_delayed_id;

/// How long a reply may take before the connection is considered dead (a blocking read waits its
/// poll window on top).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of an operation on the shared connection when the connection breaks.
const ATTEMPTS: u32 = 5;

/// A Redis Streams transport: one stream and consumer group per queue.
///
/// See the crate documentation for the data layout and the delivery guarantees.
pub struct RedisTransport {
    pub(crate) options: RedisOptions,
    pub(crate) delayed_key: String,
    pub(crate) delayed_data_key: String,
    pub(crate) maxlen: String,
    pub(crate) registry: Arc<MessageRegistry>,
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) shared: Link,
    pub(crate) reader: tokio::sync::Mutex<Reader>,
    /// Deliveries handed out and not yet acked. An entry leaves when it is acked, rejected or
    /// retried, when a keepalive finds the delivery no longer ours (another consumer claimed
    /// it), or once it has gone a whole redelivery window without a keepalive (a delivery the
    /// worker let go of: by then anyone may have claimed it).
    pub(crate) in_flight: Mutex<InFlight>,
    /// When `deliver` next drops in-flight entries older than the redelivery window.
    next_prune: Mutex<Instant>,
    pub(crate) due_hint: Mutex<Option<Instant>>,
    /// The delivery tag of every first delivery (count 1, nearly all of them), shared.
    first_delivery: Arc<DeliveryTagStamp>,
    /// The server, redacted, with its database: where the worker registry lives.
    pub(crate) location: String,
    /// Set on a keyed queue (`concurrency_max`, `fair`): messages live in lists per key.
    pub(crate) keyed: Option<crate::keyed::Keyed>,
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Whether an operation may succeed on a new connection.
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    is_connection_error(e) || has_code(e, "NOSCRIPT")
}

impl RedisTransport {
    /// Connects to `url` (`redis://[user:password@]host[:port][/db]`, `rediss://` with the `tls`
    /// feature) and decodes received messages with `registry`.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for a bad URL, [`TransportErrorKind::Connection`] when the
    /// server cannot be reached.
    pub async fn connect(
        url: &str,
        options: RedisOptions,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let config_error = |e: RedisError| {
            TransportError::new(TransportErrorKind::Config, options.name.clone())
                .with_context("invalid Redis URL")
                .with_source(e)
        };
        options.check_flow_control().map_err(|reason| {
            TransportError::new(TransportErrorKind::Config, options.name.clone())
                .with_context(reason)
        })?;
        let mut info = url.into_connection_info().map_err(config_error)?;
        if let Some(db) = options.db {
            let settings = info.redis_settings().clone().set_db(db);
            info = info.set_redis_settings(settings);
        }
        let client = Client::open(info).map_err(config_error)?;
        let scripts = Arc::new(Scripts::new());
        // Response timeouts only detect a dead connection. The reader's is the longer one, so a
        // blocking read never moves the runtime's next timer earlier (which costs a wake-up).
        let shared = Link::new(
            client.clone(),
            RESPONSE_TIMEOUT,
            options.consumer.clone(),
            scripts.clone(),
        );
        let reader_link = Link::new(
            client,
            options.poll_window + RESPONSE_TIMEOUT,
            options.consumer.clone(),
            scripts.clone(),
        );
        let transport = Self {
            delayed_key: options.delayed_key(),
            delayed_data_key: options.delayed_data_key(),
            maxlen: options
                .stream_max_entries
                .map_or_else(|| "0".to_owned(), |n| n.to_string()),
            registry,
            scripts,
            shared,
            reader: tokio::sync::Mutex::new(Reader::new(reader_link)),
            in_flight: Mutex::new(InFlight::default()),
            next_prune: Mutex::new(Instant::now()),
            due_hint: Mutex::new(None),
            first_delivery: Arc::new(DeliveryTagStamp("1".to_owned())),
            location: match options.db {
                Some(db) => format!("{}?db={db}", courier_core::redact(url)),
                None => courier_core::redact(url),
            },
            keyed: crate::keyed::Keyed::new(&options),
            options,
        };
        transport
            .shared
            .get()
            .await
            .map_err(|e| transport.error(e, "cannot connect"))?;
        Ok(transport)
    }

    /// The options in effect.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// This transport's consumer name, also the `CLIENT SETNAME` of its connections.
    #[must_use]
    pub fn consumer(&self) -> &str {
        &self.options.consumer
    }

    /// The keys this transport uses: the stream, the delayed set and the delayed data hash.
    #[must_use]
    pub fn keys(&self) -> [&str; 3] {
        [
            &self.options.stream,
            &self.delayed_key,
            &self.delayed_data_key,
        ]
    }

    pub(crate) fn error(&self, e: RedisError, context: &'static str) -> TransportError {
        let kind = if e.is_timeout() {
            TransportErrorKind::Timeout
        } else if is_connection_error(&e) || is_server_busy(&e) {
            TransportErrorKind::Connection
        } else {
            TransportErrorKind::Protocol
        };
        TransportError::new(kind, self.options.name.clone())
            .with_context(context)
            .with_source(e)
    }

    pub(crate) fn in_flight(&self) -> MutexGuard<'_, InFlight> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn encode_error(&self, e: EncodeError) -> TransportError {
        TransportError::new(TransportErrorKind::Encode, self.options.name.clone()).with_source(e)
    }

    /// `XGROUP CREATE stream group 0 MKSTREAM`, accepting an existing group.
    pub(crate) fn create_group_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg("0")
            .arg("MKSTREAM");
        cmd
    }

    pub(crate) async fn create_group(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), RedisError> {
        match self.create_group_cmd().query_async::<()>(conn).await {
            Err(e) if has_code(&e, "BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// Runs a pipeline on the shared connection, reconnecting (with backoff) and retrying when the
    /// connection broke or the server lost the scripts, and recreating a missing group.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisError> {
        let mut attempt = 1;
        let mut group_created = false;
        loop {
            let err = match self.shared.get().await {
                Ok((generation, mut conn)) => match pipe.query_async::<T>(&mut conn).await {
                    Ok(value) => return Ok(value),
                    Err(e) if has_code(&e, "NOGROUP") && !group_created => {
                        group_created = true;
                        self.create_group(&mut conn).await?;
                        continue;
                    }
                    Err(e) => {
                        if is_retryable(&e) {
                            self.shared.reset(generation).await;
                        }
                        e
                    }
                },
                Err(e) => e,
            };
            if attempt >= ATTEMPTS || !is_retryable(&err) {
                return Err(err);
            }
            attempt += 1;
        }
    }
}
