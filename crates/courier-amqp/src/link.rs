//! The connection to the broker: connect with a timeout, reconnect with capped exponential
//! backoff, declare the topology, and the publishing channel (publisher confirms on).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Backoff, TransportError, TransportErrorKind};
use lapin::options::{
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::time::Instant;

use crate::AmqpOptions;
use crate::delay::{DELAY_HEADER, DelayRoute, delay_exchange};

/// The first reconnect wait; it doubles up to `max_backoff`.
const RECONNECT_BASE: Duration = Duration::from_millis(100);

/// A live connection with its confirming publisher channel.
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) connection: Arc<Connection>,
    pub(crate) publisher: Channel,
    /// Delay bucket queues declared on this connection.
    delay_queues: Arc<Mutex<HashSet<(DelayRoute, u64)>>>,
}

impl Session {
    fn alive(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }
}

struct State {
    session: Option<Session>,
    failures: u32,
    next_attempt: Option<Instant>,
}

/// Connection manager shared by the sending and receiving halves.
pub(crate) struct Link {
    uri: String,
    name: String,
    pub(crate) options: AmqpOptions,
    state: tokio::sync::Mutex<State>,
    /// Every delay bucket queue declared by this process (for [`Link::delete_topology`]).
    delay_queues: Mutex<HashSet<(DelayRoute, u64)>>,
}

impl Link {
    /// The broker URI and the transport's name (for another view of the same transport).
    pub(crate) fn identity(&self) -> (&str, &str) {
        (&self.uri, &self.name)
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A lapin error as a transport error. Broken connections are [`TransportErrorKind::Connection`]
/// (transient), and so are the broker's hard errors that close a connection for a reason of its
/// own: `CONNECTION_FORCED` (an operator closed it, or the broker is shutting down),
/// `INTERNAL_ERROR` and `RESOURCE_ERROR` (a resource alarm). Other AMQP errors (access refused,
/// a queue declared differently, a frame the broker rejects) are
/// [`TransportErrorKind::Protocol`]: retrying as it is would fail again.
pub(crate) fn amqp_error(name: &str, context: &str, e: lapin::Error) -> TransportError {
    let kind = kind_of(&e);
    TransportError::new(kind, name.to_owned())
        .with_context(context.to_owned())
        .with_source(e)
}

fn kind_of(e: &lapin::Error) -> TransportErrorKind {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError as Hard};
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Hard(
                Hard::CONNECTIONFORCED | Hard::INTERNALERROR | Hard::RESOURCEERROR,
            ) => TransportErrorKind::Connection,
            _ => TransportErrorKind::Protocol,
        },
        _ => TransportErrorKind::Connection,
    }
}

impl Link {
    pub(crate) fn new(uri: String, name: String, options: AmqpOptions) -> Self {
        Self {
            uri,
            name,
            options,
            state: tokio::sync::Mutex::new(State {
                session: None,
                failures: 0,
                next_attempt: None,
            }),
            delay_queues: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn error(&self, kind: TransportErrorKind, context: impl Into<String>) -> TransportError {
        TransportError::new(kind, self.name.clone()).with_context(context.into())
    }

    /// The live session, connecting first when there is none. During an outage this fails at
    /// once (a transient [`TransportErrorKind::Connection`]) until the backoff has passed, then
    /// makes one attempt bounded by the connect timeout: it never hangs.
    pub(crate) async fn session(&self) -> Result<Session, TransportError> {
        let mut state = self.state.lock().await;
        if let Some(s) = &mut state.session {
            if s.alive() {
                return Ok(s.clone());
            }
            if s.connection.status().connected() {
                // Only the publishing channel died (e.g. the broker refused a publish): reopen it.
                let reopened = tokio::time::timeout(
                    self.options.connect_timeout,
                    self.open_publisher(&s.connection),
                )
                .await;
                match reopened {
                    Ok(Ok(publisher)) => {
                        s.publisher = publisher;
                        return Ok(s.clone());
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "amqp publishing channel could not be reopened")
                    }
                    Err(_) => {
                        tracing::warn!("amqp publishing channel could not be reopened in time")
                    }
                }
            }
            if state.session.as_ref().is_some_and(|s| !s.alive()) {
                tracing::warn!(messaging.destination.name = %self.name, "amqp connection lost; reconnecting");
                state.session = None;
            }
        }
        if let Some(at) = state.next_attempt {
            let now = Instant::now();
            if at > now {
                return Err(self.error(
                    TransportErrorKind::Connection,
                    format!(
                        "broker unreachable; next reconnect attempt in {:?}",
                        at - now
                    ),
                ));
            }
        }
        match tokio::time::timeout(self.options.connect_timeout, self.connect()).await {
            Ok(Ok(session)) => {
                state.failures = 0;
                state.next_attempt = None;
                state.session = Some(session.clone());
                Ok(session)
            }
            Ok(Err(e)) => {
                self.failed(&mut state);
                Err(e)
            }
            Err(_) => {
                self.failed(&mut state);
                Err(self.error(
                    TransportErrorKind::Timeout,
                    "connecting to the broker timed out",
                ))
            }
        }
    }

    fn failed(&self, state: &mut State) {
        state.failures = state.failures.saturating_add(1);
        let backoff = Backoff::new(RECONNECT_BASE, self.options.max_backoff)
            .delay(state.failures.saturating_sub(1));
        state.next_attempt = Some(Instant::now() + backoff);
        tracing::warn!(messaging.destination.name = %self.name, failures = state.failures, ?backoff, "amqp connect failed");
    }

    /// The time until the next reconnect attempt is allowed (zero when connected or due).
    pub(crate) async fn backoff_remaining(&self) -> Duration {
        let state = self.state.lock().await;
        state.next_attempt.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// Drops the session (after an error that shows it is dead).
    pub(crate) async fn invalidate(&self) {
        let mut state = self.state.lock().await;
        if state
            .session
            .as_ref()
            .is_some_and(|s| !s.connection.status().connected())
        {
            state.session = None;
        }
    }

    async fn connect(&self) -> Result<Session, TransportError> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(format!("courier:{}", self.name)));
        let connection = Connection::connect(&self.uri, props)
            .await
            .map_err(|e| amqp_error(&self.name, "cannot connect to the broker", e))?;
        let publisher = self.open_publisher(&connection).await?;
        let session = Session {
            connection: Arc::new(connection),
            publisher,
            delay_queues: Arc::new(Mutex::new(HashSet::new())),
        };
        if self.options.auto_setup {
            self.declare(&session).await?;
        }
        tracing::debug!(messaging.destination.name = %self.name, "amqp connected");
        Ok(session)
    }

    async fn open_publisher(&self, connection: &Connection) -> Result<Channel, TransportError> {
        let publisher = connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(&self.name, "cannot open the publishing channel", e))?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| amqp_error(&self.name, "cannot enable publisher confirms", e))?;
        Ok(publisher)
    }

    /// Declares the exchange, the queues and their bindings, and the delay exchange, on a
    /// channel of its own (a refused declaration closes only that channel). Idempotent.
    pub(crate) async fn declare(&self, session: &Session) -> Result<(), TransportError> {
        let o = &self.options;
        let ch = session
            .connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(&self.name, "cannot open a channel for setup", e))?;
        self.declare_exchange(&ch, &o.exchange, o.exchange_type.kind())
            .await?;
        let delay_ex = delay_exchange(&o.exchange);
        self.declare_exchange(&ch, &delay_ex, ExchangeKind::Headers)
            .await?;
        for q in &o.queues {
            let mut args = FieldTable::default();
            for (k, v) in &q.arguments {
                args.insert(ShortString::from(k.as_str()), v.to_amqp());
            }
            ch.queue_declare(q.name.as_str().into(), QueueDeclareOptions::durable(), args)
                .await
                .map_err(|e| {
                    amqp_error(
                        &self.name,
                        format!("cannot declare queue `{}`", q.name).as_str(),
                        e,
                    )
                })?;
            let keys: Vec<&str> = if q.binding_keys.is_empty() {
                vec![o.routing_key.as_str()]
            } else {
                q.binding_keys.iter().map(String::as_str).collect()
            };
            for key in keys {
                ch.queue_bind(
                    q.name.as_str().into(),
                    o.exchange.as_str().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    amqp_error(
                        &self.name,
                        format!("cannot bind queue `{}`", q.name).as_str(),
                        e,
                    )
                })?;
            }
        }
        let _ = ch.close(200, "setup done".into()).await;
        Ok(())
    }

    /// Declares the bucket queue for `(route, bucket)` once per connection.
    /// Declares a durable exchange (idempotent).
    async fn declare_exchange(
        &self,
        ch: &Channel,
        name: &str,
        kind: ExchangeKind,
    ) -> Result<(), TransportError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        ch.exchange_declare(name.into(), kind, durable, FieldTable::default())
            .await
            .map_err(|e| {
                amqp_error(
                    &self.name,
                    format!("cannot declare exchange `{name}`").as_str(),
                    e,
                )
            })
    }

    pub(crate) async fn ensure_delay_queue(
        &self,
        session: &Session,
        route: DelayRoute,
        bucket: u64,
    ) -> Result<(), TransportError> {
        if session
            .delay_queues
            .lock()
            .map(|set| set.contains(&(route, bucket)))
            .unwrap_or(false)
        {
            return Ok(());
        }
        let o = &self.options;
        let name = route.queue_name(&o.exchange, bucket);
        let ch = session
            .connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(&self.name, "cannot open a channel for setup", e))?;
        let delay_ex = delay_exchange(&o.exchange);
        self.declare_exchange(&ch, &delay_ex, ExchangeKind::Headers)
            .await?;
        let mut args = FieldTable::default();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(i64::try_from(bucket).unwrap_or(i64::MAX)),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(LongString::from(route.dead_letter_exchange(&o.exchange))),
        );
        ch.queue_declare(name.as_str().into(), QueueDeclareOptions::durable(), args)
            .await
            .map_err(|e| {
                amqp_error(
                    &self.name,
                    format!("cannot declare delay queue `{name}`").as_str(),
                    e,
                )
            })?;
        let mut bind = FieldTable::default();
        bind.insert(
            "x-match".into(),
            AMQPValue::LongString(LongString::from("all")),
        );
        bind.insert(
            DELAY_HEADER.into(),
            AMQPValue::LongString(LongString::from(route.header_value(bucket))),
        );
        ch.queue_bind(
            name.as_str().into(),
            delay_ex.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            bind,
        )
        .await
        .map_err(|e| {
            amqp_error(
                &self.name,
                format!("cannot bind delay queue `{name}`").as_str(),
                e,
            )
        })?;
        let _ = ch.close(200, "setup done".into()).await;
        if let Ok(mut set) = session.delay_queues.lock() {
            set.insert((route, bucket));
        }
        if let Ok(mut set) = self.delay_queues.lock() {
            set.insert((route, bucket));
        }
        Ok(())
    }

    /// The delay bucket queues this process declared.
    pub(crate) fn known_delay_queues(&self) -> Vec<String> {
        let set = self
            .delay_queues
            .lock()
            .map(|s| s.iter().copied().collect::<Vec<_>>())
            .unwrap_or_default();
        set.into_iter()
            .map(|(route, bucket)| route.queue_name(&self.options.exchange, bucket))
            .collect()
    }

    /// Deletes the queues, the delay bucket queues this process declared, and both exchanges.
    pub(crate) async fn delete_topology(&self) -> Result<(), TransportError> {
        let session = self.session().await?;
        let o = &self.options;
        let ch = session
            .connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(&self.name, "cannot open a channel", e))?;
        let delays: Vec<(DelayRoute, u64)> = self
            .delay_queues
            .lock()
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut queues: Vec<String> = o.queues.iter().map(|q| q.name.clone()).collect();
        queues.extend(
            delays
                .into_iter()
                .map(|(route, bucket)| route.queue_name(&o.exchange, bucket)),
        );
        for q in queues {
            ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
                .map_err(|e| {
                    amqp_error(&self.name, format!("cannot delete queue `{q}`").as_str(), e)
                })?;
        }
        for ex in [delay_exchange(&o.exchange), o.exchange.clone()] {
            ch.exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
                .await
                .map_err(|e| {
                    amqp_error(
                        &self.name,
                        format!("cannot delete exchange `{ex}`").as_str(),
                        e,
                    )
                })?;
        }
        let _ = ch.close(200, "teardown done".into()).await;
        Ok(())
    }

    /// Closes the connection (tests and shutdown).
    pub(crate) async fn close(&self) {
        let mut state = self.state.lock().await;
        if let Some(s) = state.session.take() {
            let _ = s.connection.close(200, "closed by courier".into()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use courier_core::TransportErrorKind;
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPHardError, AMQPSoftError};

    use super::amqp_error;

    fn protocol(kind: AMQPErrorKind) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind, "from the broker".into())).into()
    }

    #[test]
    fn a_connection_the_broker_closed_is_transient() {
        for hard in [
            AMQPHardError::CONNECTIONFORCED,
            AMQPHardError::INTERNALERROR,
            AMQPHardError::RESOURCEERROR,
        ] {
            let e = amqp_error(
                "orders",
                "publisher confirm failed",
                protocol(AMQPErrorKind::Hard(hard)),
            );
            assert_eq!(e.kind(), TransportErrorKind::Connection, "{e}");
            assert!(e.is_transient(), "{e}");
        }
    }

    #[test]
    fn a_refusal_the_broker_would_repeat_is_not_transient() {
        for kind in [
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
            AMQPErrorKind::Hard(AMQPHardError::FRAMEERROR),
        ] {
            let e = amqp_error("orders", "queue.declare failed", protocol(kind));
            assert_eq!(e.kind(), TransportErrorKind::Protocol, "{e}");
            assert!(!e.is_transient(), "{e}");
        }
    }
}
