//! [`RedisTransport`]: Symfony Messenger's Redis stream, read and written as PHP does, so that
//! PHP and Courier workers consume one stream together.

mod options;
mod send;
mod verbs;
mod wire;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{
    Encoded, Envelope, MessageRegistry, TransportError, TransportErrorKind, TransportMessageIdStamp,
};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult,
    Value,
};

pub use options::RedisOptions;
use options::Server;
pub(crate) use options::from_dsn;
use wire::{Entry, Scripts};

use crate::{PHP_DECODE_ERROR_HEADER, SymfonySerializer, redis_field};

/// How long a Redis reply may take before the connection counts as dead.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most delayed messages one `get` moves to the stream.
const MOVE_LIMIT: usize = 1000;

/// Where `get` stands in PHP's reading order.
#[derive(Debug)]
struct ReadState {
    /// The group exists (or `auto_setup` is off).
    set_up: bool,
    /// Reading this consumer's own pending entries (those left from an earlier run), after this
    /// id; `None` once they are all read, then new ones only (`>`).
    pending_after: Option<String>,
    /// When to look for others' entries idle past `redeliver_timeout` next.
    next_claim: Instant,
    /// The ids handed out and not yet acked, rejected or retried.
    in_flight: HashSet<String>,
}

/// Symfony Messenger 5.4's Redis transport (a stream, a consumer group, delayed messages in
/// `<stream>__queue`), read and written as PHP does: PHP and Courier workers consume one stream
/// together, each side moves the other's delayed messages when they are due, and a retry
/// crosses sides with its count.
///
/// - `send` adds an entry whose `message` field is JSON `{"body", "headers"}` (written with
///   phpredis's PHP serializer unless `serializer=0`); a message with a `DelayStamp` goes to
///   the sorted set `<stream>__queue` instead, as JSON `{"body", "headers", "uniqid"}` scored
///   by its due time in milliseconds, as PHP writes it.
/// - `get` moves the due delayed messages to the stream (what PHP's `ZPOPMIN` and `XADD` do, in
///   one script), then reads with `XREADGROUP`, the move and the read in one round trip:
///   first this consumer's own pending entries left from an earlier run, then new ones; every
///   `claim_interval` it claims (`XCLAIM`) the entries idle past `redeliver_timeout`. Entries
///   deleted while pending are acked and skipped, as PHP does.
/// - `keepalive` resets the idle time of what Courier holds (`XCLAIM <id> JUSTID` to itself,
///   only while still its own), so that no PHP worker claims it during a long handler.
/// - `ack` is `XACK` (and `XDEL` with `delete_after_ack`); `reject` is `XACK` and `XDEL`
///   (unless `delete_after_reject` is off); `retry` sends a new message (with the
///   `RedeliveryStamp` the worker added and a `DelayStamp`) and rejects the old entry, as
///   PHP's retry listener and worker do.
///
/// ```no_run
/// # async fn run() -> Result<(), courier_core::TransportError> {
/// use std::sync::Arc;
/// use courier_core::MessageRegistry;
/// use courier_symfony::{RedisOptions, RedisTransport, SymfonySerializer, SymfonyTypes};
///
/// let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send"));
/// let transport = RedisTransport::connect(
///     "async",
///     "127.0.0.1",
///     6379,
///     RedisOptions::default().stream("messages").consumer("rust-1"),
///     serializer,
///     Arc::new(MessageRegistry::new()),
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub struct RedisTransport {
    name: String,
    /// `host:port`, for errors.
    addr: String,
    client: Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    options: RedisOptions,
    queue: String,
    serializer: SymfonySerializer,
    registry: Arc<MessageRegistry>,
    scripts: Scripts,
    state: Mutex<ReadState>,
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Connects to the Redis server at `host:port` (no password) and, unless `auto_setup` is
    /// off, creates the group (and the stream) when missing.
    ///
    /// # Errors
    /// [`TransportErrorKind::Connection`] when the server cannot be reached; the setup's error.
    pub async fn connect(
        name: impl Into<String>,
        host: &str,
        port: u16,
        options: RedisOptions,
        serializer: SymfonySerializer,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let server = Server {
            host: host.to_owned(),
            port,
            user: None,
            password: None,
        };
        Self::connect_to(name.into(), &server, options, serializer, registry).await
    }

    pub(crate) async fn connect_to(
        name: String,
        server: &Server,
        options: RedisOptions,
        serializer: SymfonySerializer,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let mut settings = redis::RedisConnectionInfo::default().set_db(options.dbindex);
        if let Some(user) = &server.user {
            settings = settings.set_username(user);
        }
        if let Some(password) = &server.password {
            settings = settings.set_password(password);
        }
        let client = ConnectionAddr::Tcp(server.host.clone(), server.port)
            .into_connection_info()
            .map(|info| info.set_redis_settings(settings))
            .and_then(Client::open)
            .map_err(|e| {
                TransportError::new(TransportErrorKind::Config, name.clone())
                    .with_context(format!(
                        "invalid Redis address {}:{}",
                        server.host, server.port
                    ))
                    .with_source(e)
            })?;
        let transport = Self {
            queue: options.queue_key(),
            state: Mutex::new(ReadState {
                set_up: !options.auto_setup,
                pending_after: Some("0".to_owned()),
                next_claim: Instant::now(),
                in_flight: HashSet::new(),
            }),
            name,
            addr: format!("{}:{}", server.host, server.port),
            client,
            conn: Mutex::new(None),
            options,
            serializer,
            registry,
            scripts: Scripts::new(),
        };
        transport.conn().await?;
        if transport.options.auto_setup {
            transport.ensure_setup().await?;
        }
        Ok(transport)
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The transport's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ReadState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn error(&self, doing: &'static str, e: RedisError) -> TransportError {
        let kind = if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
            TransportErrorKind::Connection
        } else {
            TransportErrorKind::Protocol
        };
        if kind == TransportErrorKind::Connection {
            // The next call connects again.
            *self
                .conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        TransportError::new(kind, self.name.clone())
            .with_context(format!("{doing} (stream `{}`)", self.options.stream))
            .with_source(e)
    }

    async fn conn(&self) -> Result<MultiplexedConnection, TransportError> {
        let held = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(conn) = held {
            return Ok(conn);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| {
                self.error("connecting to Redis", e)
                    .with_context(format!("connecting to Redis at {}", self.addr))
            })?;
        *self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// Creates the group (and the stream) when missing, as PHP's `setup()` does; with
    /// `delete_after_ack` or `delete_after_reject`, refuses a stream with more than one group.
    async fn create_group(&self) -> Result<(), TransportError> {
        let mut conn = self.conn().await?;
        let created: Result<Value, RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg(0)
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(self.error("creating the consumer group", e)),
        }
        if self.options.delete_after_ack || self.options.delete_after_reject {
            let groups: Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&self.options.stream)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.error("listing the consumer groups", e))?;
            let count = wire::group_names(groups).len();
            if count > 1 {
                return Err(
                    TransportError::new(TransportErrorKind::Config, self.name.clone())
                        .with_context(format!(
                            "more than one group exists for stream `{}`: delete_after_ack and \
                         delete_after_reject cannot be enabled, as they risk deleting messages \
                         before all groups could consume them",
                            self.options.stream
                        )),
                );
            }
        }
        Ok(())
    }

    /// Whether the stream has the group (`XINFO GROUPS`; a missing stream has none).
    async fn group_exists(&self) -> Result<bool, TransportError> {
        let mut conn = self.conn().await?;
        let groups: Result<Value, RedisError> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&self.options.stream)
            .query_async(&mut conn)
            .await;
        let groups = match groups {
            Ok(groups) => groups,
            // `ERR no such key`: no stream, so no group.
            Err(e) if e.to_string().contains("no such key") => return Ok(false),
            Err(e) => return Err(self.error("listing the consumer groups", e)),
        };
        Ok(wire::group_names(groups).contains(&self.options.group))
    }

    async fn ensure_setup(&self) -> Result<(), TransportError> {
        if self.state().set_up {
            return Ok(());
        }
        self.create_group().await?;
        self.state().set_up = true;
        Ok(())
    }

    fn entry_id(&self, envelope: &Envelope) -> Result<String, TransportError> {
        envelope
            .last::<TransportMessageIdStamp>()
            .map(|s| s.0.clone())
            .ok_or_else(|| {
                TransportError::new(TransportErrorKind::NotFound, self.name.clone())
                    .with_context("envelope has no stream entry id (TransportMessageIdStamp)")
            })
    }

    fn decode(&self, id: String, field: &[u8]) -> Envelope {
        let envelope = match redis_field::read_parts(field) {
            Ok((body, headers)) => self.serializer.decode(&self.registry, body, &headers),
            // Kept as it is, with the reason, for the failure transport.
            Err(e) => self.registry.decode(Encoded {
                body: String::from_utf8_lossy(field).into_owned(),
                headers: BTreeMap::from([(
                    PHP_DECODE_ERROR_HEADER.to_owned(),
                    format!("{e}: {}", courier_core::error_chain(&e)),
                )]),
            }),
        };
        envelope.with(TransportMessageIdStamp(id))
    }

    /// `XACK` the ids, and `XDEL` them when `delete`.
    async fn finish(
        &self,
        ids: Vec<String>,
        delete: bool,
        doing: &'static str,
    ) -> Result<(), TransportError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.cmd("XACK")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg(&ids)
            .ignore();
        if delete {
            pipe.cmd("XDEL")
                .arg(&self.options.stream)
                .arg(&ids)
                .ignore();
        }
        let mut conn = self.conn().await?;
        let () = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(doing, e))?;
        let mut state = self.state();
        for id in &ids {
            state.in_flight.remove(id);
        }
        Ok(())
    }

    /// Claims the entries idle past `redeliver_timeout` (others', or this consumer's that no one
    /// keeps alive), at most `max`: what PHP's `claimOldPendingMessages` does, with their
    /// fields at once.
    async fn claim(
        &self,
        conn: &mut MultiplexedConnection,
        max: usize,
    ) -> Result<Vec<Entry>, TransportError> {
        let idle = u64::try_from(self.options.redeliver_timeout.as_millis()).unwrap_or(u64::MAX);
        let pending: Value = redis::cmd("XPENDING")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg("IDLE")
            .arg(idle)
            .arg("-")
            .arg("+")
            .arg(max)
            .query_async(conn)
            .await
            .map_err(|e| self.error("listing pending messages", e))?;
        let ids: Vec<String> = {
            let state = self.state();
            wire::pending_ids(pending)
                .into_iter()
                .filter(|id| !state.in_flight.contains(id))
                .collect()
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let claimed: Value = redis::cmd("XCLAIM")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg(idle)
            .arg(&ids)
            .query_async(conn)
            .await
            .map_err(|e| self.error("claiming pending messages", e))?;
        Ok(wire::entries(claimed))
    }

    /// The move of the due delayed messages (the `MOVE_DUE` script), to run alone or in a
    /// pipeline.
    fn move_invocation(&self) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.move_due.prepare_invoke();
        invocation
            .key(&self.queue)
            .key(&self.options.stream)
            .arg(wire::now_ms())
            .arg(MOVE_LIMIT)
            .arg(if self.options.php_serializer {
                "1"
            } else {
                "0"
            })
            .arg(self.options.stream_max_entries);
        invocation
    }

    /// Moves the due delayed messages to the stream.
    async fn move_due(&self, conn: &mut MultiplexedConnection) -> Result<(), TransportError> {
        let _moved: u64 = self
            .move_invocation()
            .invoke_async(conn)
            .await
            .map_err(|e| self.error("moving due delayed messages", e))?;
        Ok(())
    }

    /// Moves the due delayed messages, then reads the group from `from`, in one round trip.
    /// What the read delivered is returned even when the move failed (the entries are this
    /// consumer's now; the move is tried again at the next `get`); a script missing from the
    /// server's cache (flushed, or a new server behind the address) is loaded for the next one.
    async fn move_and_read(
        &self,
        conn: &mut MultiplexedConnection,
        from: &str,
        count: usize,
    ) -> Result<Vec<Entry>, TransportError> {
        let invocation = self.move_invocation();
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .invoke_script(&invocation)
            .add_command(self.read_cmd(from, count));
        let replies: Vec<RedisResult<Value>> = pipe
            .query_async(conn)
            .await
            .map_err(|e| self.error("reading the stream", e))?;
        let mut replies = replies.into_iter();
        let (moved, read) = (replies.next(), replies.next());
        let entries = match read {
            Some(read) => self.read_result(read)?,
            None => {
                return Err(
                    TransportError::new(TransportErrorKind::Protocol, self.name.clone())
                        .with_context("no reply to reading the stream"),
                );
            }
        };
        match moved {
            Some(Err(e)) if e.code() == Some("NOSCRIPT") => {
                self.scripts
                    .move_due
                    .load_async(conn)
                    .await
                    .map_err(|e| self.error("loading the delayed messages' script", e))?;
            }
            Some(Err(e)) if entries.is_empty() => {
                return Err(self.error("moving due delayed messages", e));
            }
            Some(Err(e)) => tracing::warn!(
                messaging.destination.name = %self.options.stream,
                error = %e,
                "moving due delayed messages failed; they are moved at the next read"
            ),
            _ => {}
        }
        Ok(entries)
    }

    fn read_cmd(&self, from: &str, count: usize) -> redis::Cmd {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&self.options.stream)
            .arg(from);
        cmd
    }

    fn read_result(&self, reply: RedisResult<Value>) -> Result<Vec<Entry>, TransportError> {
        let reply = reply.map_err(|e| {
            if e.code() == Some("NOGROUP") && self.options.auto_setup {
                // The stream or its group was deleted: the next `get` creates them again.
                self.state().set_up = false;
            }
            self.error("reading the stream", e)
        })?;
        Ok(wire::read_reply(reply))
    }

    async fn read_group(
        &self,
        conn: &mut MultiplexedConnection,
        from: &str,
        count: usize,
    ) -> Result<Vec<Entry>, TransportError> {
        let reply = self.read_cmd(from, count).query_async(conn).await;
        self.read_result(reply)
    }
}
