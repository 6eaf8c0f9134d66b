//! The connection to the broker, its two channels (publishing with confirms, and getting) and
//! the topology PHP declares: the exchange, the queues and their bindings, the delay exchange
//! and the per-delay queues.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use courier_core::{TransportError, TransportErrorKind};
use lapin::options::{
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::options::{AmqpOptions, QueueArgument};

/// How long a declared delay queue is taken as still there: PHP's delay queues expire 10 s
/// (`x-expires` = delay + 10 s) after their last use, a message leaves one `delay` after it was
/// published, so one declared less than 5 s ago outlives what is published into it now.
const DELAY_QUEUE_FRESH: Duration = Duration::from_secs(5);

/// A live connection: the publishing channel (confirms on) and the getting channel.
pub(crate) struct Session {
    pub(crate) connection: Connection,
    pub(crate) publisher: Channel,
    pub(crate) getter: Channel,
    /// Tells this session's delivery tags from an earlier one's.
    pub(crate) generation: u64,
    delay_exchange_declared: bool,
    delay_queues: HashMap<String, Instant>,
}

impl Session {
    fn alive(&self) -> bool {
        self.connection.status().connected()
            && self.publisher.status().connected()
            && self.getter.status().connected()
    }
}

/// The broker's address and the session, (re)connected when needed.
pub(crate) struct Link {
    name: String,
    uri: AMQPUri,
    pub(crate) options: AmqpOptions,
    session: tokio::sync::Mutex<Option<Session>>,
    generations: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .field("host", &self.uri.authority.host)
            .field("port", &self.uri.authority.port)
            .field("vhost", &self.uri.vhost)
            .field("user", &self.uri.authority.userinfo.username)
            .finish_non_exhaustive()
    }
}

/// A lapin error as a transport error: a broken connection is transient
/// ([`TransportErrorKind::Connection`]), what the broker refuses is
/// [`TransportErrorKind::Protocol`].
pub(crate) fn amqp_error(name: &str, doing: &str, e: lapin::Error) -> TransportError {
    let kind = match e.kind() {
        lapin::ErrorKind::ProtocolError(_) => TransportErrorKind::Protocol,
        _ => TransportErrorKind::Connection,
    };
    TransportError::new(kind, name.to_owned())
        .with_context(doing.to_owned())
        .with_source(e)
}

fn short(name: &str, what: &str, value: &str) -> Result<ShortString, TransportError> {
    ShortString::try_new(value).map_err(|_| {
        TransportError::new(TransportErrorKind::Config, name.to_owned())
            .with_context(format!("{what} `{value}` is longer than 255 bytes"))
    })
}

impl Link {
    pub(crate) fn new(name: String, uri: AMQPUri, options: AmqpOptions) -> Self {
        Self {
            name,
            uri,
            options,
            session: tokio::sync::Mutex::new(None),
            generations: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn err(&self, doing: &str, e: lapin::Error) -> TransportError {
        amqp_error(&self.name, doing, e)
    }

    /// Runs `f` on the live session (connecting first when there is none or it died).
    pub(crate) async fn with<T>(
        &self,
        f: impl AsyncFnOnce(&mut Session) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        let mut guard = self.session.lock().await;
        if !guard.as_ref().is_some_and(Session::alive) {
            if let Some(old) = guard.take() {
                tracing::warn!(messaging.destination.name = %self.name, "amqp connection lost; reconnecting");
                let _ = old.connection.close(200, "reconnecting".into()).await;
            }
            *guard = Some(self.connect().await?);
        }
        let Some(session) = guard.as_mut() else {
            return Err(TransportError::new(
                TransportErrorKind::Connection,
                self.name.clone(),
            ));
        };
        f(session).await
    }

    async fn connect(&self) -> Result<Session, TransportError> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(format!("courier-symfony:{}", self.name)));
        let connection = tokio::time::timeout(
            Duration::from_secs(20),
            Connection::connect_uri(self.uri.clone(), props),
        )
        .await
        .map_err(|_| {
            TransportError::new(TransportErrorKind::Connection, self.name.clone())
                .with_context("cannot connect to the broker within 20s")
        })?
        .map_err(|e| self.err("cannot connect to the broker", e))?;
        let publisher = connection
            .create_channel()
            .await
            .map_err(|e| self.err("cannot open the publishing channel", e))?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| self.err("cannot enable publisher confirms", e))?;
        let getter = connection
            .create_channel()
            .await
            .map_err(|e| self.err("cannot open the receiving channel", e))?;
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = Session {
            connection,
            publisher,
            getter,
            generation,
            delay_exchange_declared: !self.options.auto_setup,
            delay_queues: HashMap::new(),
        };
        if self.options.auto_setup {
            self.declare(&session.publisher).await?;
        }
        Ok(session)
    }

    /// Declares the exchange, the queues and their bindings as PHP's `setupExchangeAndQueues`
    /// does (durable; a queue with no binding key bound with the empty key).
    pub(crate) async fn declare(&self, ch: &Channel) -> Result<(), TransportError> {
        let o = &self.options;
        let kind = match o.exchange_type.as_str() {
            "fanout" => ExchangeKind::Fanout,
            "direct" => ExchangeKind::Direct,
            "topic" => ExchangeKind::Topic,
            "headers" => ExchangeKind::Headers,
            other => ExchangeKind::Custom(other.to_owned()),
        };
        let exchange = short(&self.name, "exchange", &o.exchange_name)?;
        ch.exchange_declare(
            exchange.clone(),
            kind,
            durable_exchange(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| self.err(&format!("cannot declare exchange `{}`", o.exchange_name), e))?;
        for queue in &o.queues {
            let mut args = FieldTable::default();
            for (key, value) in &queue.arguments {
                let value = match value {
                    QueueArgument::Int(i) => AMQPValue::LongLongInt(*i),
                    QueueArgument::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
                };
                args.insert(short(&self.name, "queue argument", key)?, value);
            }
            let name = short(&self.name, "queue", &queue.name)?;
            ch.queue_declare(name.clone(), durable_queue(), args)
                .await
                .map_err(|e| self.err(&format!("cannot declare queue `{}`", queue.name), e))?;
            let keys: Vec<&str> = if queue.binding_keys.is_empty() {
                vec![""]
            } else {
                queue.binding_keys.iter().map(String::as_str).collect()
            };
            for key in keys {
                ch.queue_bind(
                    name.clone(),
                    exchange.clone(),
                    short(&self.name, "binding key", key)?,
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    self.err(
                        &format!(
                            "cannot bind queue `{}` to `{}` with `{key}`",
                            queue.name, o.exchange_name
                        ),
                        e,
                    )
                })?;
            }
        }
        Ok(())
    }

    /// The delay exchange (direct, durable) and the delay queue `queue` as PHP's `setupDelay`
    /// declares them: `x-message-ttl` the delay, `x-expires` 10 s more, dead-lettered to the
    /// exchange (to the default exchange for a retry) with the original routing key.
    pub(crate) async fn declare_delay(
        &self,
        session: &mut Session,
        queue: &str,
        delay_ms: u64,
        dead_letter: (&str, &str),
    ) -> Result<(), TransportError> {
        let o = &self.options;
        let ch = &session.publisher;
        let delays = short(&self.name, "delay exchange", &o.delay_exchange_name)?;
        if !session.delay_exchange_declared {
            ch.exchange_declare(
                delays.clone(),
                ExchangeKind::Direct,
                durable_exchange(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                self.err(
                    &format!("cannot declare delay exchange `{}`", o.delay_exchange_name),
                    e,
                )
            })?;
            session.delay_exchange_declared = true;
        }
        if session
            .delay_queues
            .get(queue)
            .is_some_and(|at| at.elapsed() < DELAY_QUEUE_FRESH)
        {
            return Ok(());
        }
        let ttl = i64::try_from(delay_ms).unwrap_or(i64::MAX);
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
        args.insert(
            "x-expires".into(),
            AMQPValue::LongLongInt(ttl.saturating_add(10_000)),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from(dead_letter.0)),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(LongString::from(dead_letter.1)),
        );
        let name = short(&self.name, "delay queue", queue)?;
        ch.queue_declare(name.clone(), durable_queue(), args)
            .await
            .map_err(|e| self.err(&format!("cannot declare delay queue `{queue}`"), e))?;
        ch.queue_bind(
            name.clone(),
            delays,
            name,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| self.err(&format!("cannot bind delay queue `{queue}`"), e))?;
        session
            .delay_queues
            .insert(queue.to_owned(), Instant::now());
        Ok(())
    }

    /// Closes the connection.
    pub(crate) async fn close(&self) {
        if let Some(s) = self.session.lock().await.take() {
            let _ = s.connection.close(200, "closed by courier".into()).await;
        }
    }
}

fn durable_exchange() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    }
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}
