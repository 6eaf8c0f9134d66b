//! The connection to the server: connect lazily with a timeout (async-nats then reconnects by
//! itself with Courier's capped backoff), create the stream and the durable consumer, and map
//! async-nats errors to [`TransportError`]s.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use async_nats::{Client, ConnectOptions};
use courier_core::{Backoff, TransportError, TransportErrorKind};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::NatsOptions;
use crate::errors::{
    connect_kind, consumer_kind, create_stream_kind, get_stream_kind, info_kind, nats_error,
};

/// The first reconnect wait; it doubles up to `max_backoff`.
const RECONNECT_BASE: Duration = Duration::from_millis(100);

/// How many publishes may await their PubAck at once on one connection; `send_batch` sends in
/// chunks well below it.
const MAX_ACK_INFLIGHT: usize = 65_536;

/// The durable pull consumer.
pub(crate) type PullConsumer = consumer::Consumer<consumer::pull::Config>;

/// Where and as whom to connect. `Debug` shows no secret.
#[derive(Clone)]
pub(crate) struct Server {
    /// `host:port`.
    pub(crate) address: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("address", &self.address)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A live connection: the client, its JetStream context and the consumer (once set up or
/// looked up).
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) client: Client,
    pub(crate) jetstream: jetstream::Context,
    pub(crate) consumer: PullConsumer,
}

struct State {
    session: Option<Session>,
    /// The delay consumer (once set up or looked up).
    delayed: Option<PullConsumer>,
    client: Option<(Client, jetstream::Context)>,
    failures: u32,
    next_attempt: Option<Instant>,
}

/// Connection manager shared by every operation of a transport.
pub(crate) struct Link {
    name: String,
    server: Server,
    pub(crate) options: NatsOptions,
    state: tokio::sync::Mutex<State>,
    /// Counts the client's disconnects, so an operation waiting for an answer the broken
    /// connection will never bring fails at once instead of at its timeout.
    disconnects: watch::Sender<u64>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(name: String, server: Server, options: NatsOptions) -> Self {
        Self {
            name,
            server,
            options,
            state: tokio::sync::Mutex::new(State {
                session: None,
                delayed: None,
                client: None,
                failures: 0,
                next_attempt: None,
            }),
            disconnects: watch::channel(0).0,
        }
    }

    /// A receiver that wakes at the client's next disconnect: subscribe before sending the
    /// request whose answer is awaited.
    pub(crate) fn disconnects(&self) -> watch::Receiver<u64> {
        self.disconnects.subscribe()
    }

    /// Awaits `fut` unless the connection breaks first (`None`).
    pub(crate) async fn unless_disconnected<T>(
        mut disconnects: watch::Receiver<u64>,
        fut: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::select! {
            v = fut => Some(v),
            _ = disconnects.changed() => None,
        }
    }

    /// The error of an operation cut short by a disconnect.
    pub(crate) fn disconnected(&self, what: &str) -> TransportError {
        self.error(
            TransportErrorKind::Connection,
            format!("the connection to the NATS server broke during {what}; reconnecting"),
        )
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn server(&self) -> &Server {
        &self.server
    }

    fn error(&self, kind: TransportErrorKind, context: impl Into<String>) -> TransportError {
        TransportError::new(kind, self.name.clone()).with_context(context.into())
    }

    /// The session, connecting and setting up (or looking up) the stream and consumer first
    /// when there is none. While the client is reconnecting this fails at once with a
    /// transient [`TransportErrorKind::Connection`] error instead of queueing the operation.
    pub(crate) async fn session(&self) -> Result<Session, TransportError> {
        let mut state = self.state.lock().await;
        let (client, jetstream) = match &state.client {
            Some(c) => c.clone(),
            None => {
                let c = self.connect(&mut state).await?;
                state.client = Some(c.clone());
                c
            }
        };
        if client.connection_state() != async_nats::connection::State::Connected {
            return Err(self.error(
                TransportErrorKind::Connection,
                "not connected to the NATS server; reconnecting",
            ));
        }
        if let Some(s) = &state.session {
            return Ok(s.clone());
        }
        let consumer = if self.options.auto_setup {
            let (consumer, delayed) = self.declare(&jetstream).await?;
            state.delayed = Some(delayed);
            consumer
        } else {
            self.lookup(&jetstream, &self.options.consumer).await?
        };
        let session = Session {
            client,
            jetstream,
            consumer,
        };
        state.session = Some(session.clone());
        Ok(session)
    }

    /// The connected client without the consumer (for sending, which needs only the stream).
    pub(crate) async fn client(&self) -> Result<(Client, jetstream::Context), TransportError> {
        let mut state = self.state.lock().await;
        let c = match &state.client {
            Some(c) => c.clone(),
            None => {
                let c = self.connect(&mut state).await?;
                state.client = Some(c.clone());
                c
            }
        };
        if c.0.connection_state() != async_nats::connection::State::Connected {
            return Err(self.error(
                TransportErrorKind::Connection,
                "not connected to the NATS server; reconnecting",
            ));
        }
        Ok(c)
    }

    /// The session and the delay consumer, setting them up (or looking them up) first.
    pub(crate) async fn delayed(&self) -> Result<(Session, PullConsumer), TransportError> {
        let session = self.session().await?;
        let mut state = self.state.lock().await;
        if let Some(delayed) = &state.delayed {
            return Ok((session, delayed.clone()));
        }
        let delayed = self
            .lookup(&session.jetstream, &self.options.delay_consumer_name())
            .await?;
        state.delayed = Some(delayed.clone());
        Ok((session, delayed))
    }

    /// Forgets the consumer handles (after one or their stream vanished): the next operation
    /// sets them up again (or looks them up).
    pub(crate) async fn invalidate(&self) {
        let mut state = self.state.lock().await;
        state.session = None;
        state.delayed = None;
    }

    async fn connect(
        &self,
        state: &mut State,
    ) -> Result<(Client, jetstream::Context), TransportError> {
        if let Some(at) = state.next_attempt {
            let now = Instant::now();
            if at > now {
                return Err(self.error(
                    TransportErrorKind::Connection,
                    format!(
                        "NATS server unreachable; next connect attempt in {:?}",
                        at - now
                    ),
                ));
            }
        }
        let cap = self.options.max_backoff;
        let disconnects = self.disconnects.clone();
        let name = self.name.clone();
        let mut options = ConnectOptions::new()
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Disconnected) {
                    disconnects.send_modify(|n| *n = n.wrapping_add(1));
                    tracing::warn!(messaging.destination.name = %name, "nats connection lost; reconnecting");
                } else if matches!(event, async_nats::Event::Connected) {
                    tracing::debug!(messaging.destination.name = %name, "nats (re)connected");
                }
                std::future::ready(())
            })
            .name(format!("courier:{}", self.name))
            .connection_timeout(self.options.connect_timeout)
            .request_timeout(Some(self.options.request_timeout))
            .reconnect_delay_callback(move |attempts| {
                Backoff::new(RECONNECT_BASE, cap)
                    .delay(u32::try_from(attempts.saturating_sub(1)).unwrap_or(u32::MAX))
            });
        if let (Some(user), Some(password)) = (&self.server.user, &self.server.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.options.token {
            options = options.token(token.clone());
        }
        let attempt = tokio::time::timeout(
            self.options.connect_timeout,
            options.connect(self.server.address.as_str()),
        )
        .await;
        let result = match attempt {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => {
                let kind = connect_kind(&e.kind());
                Err(nats_error(
                    &self.name,
                    kind,
                    format!(
                        "cannot connect to the NATS server at {}",
                        self.server.address
                    ),
                    e,
                ))
            }
            Err(_) => Err(self.error(
                TransportErrorKind::Timeout,
                format!(
                    "connecting to the NATS server at {} timed out",
                    self.server.address
                ),
            )),
        };
        match result {
            Ok(client) => {
                state.failures = 0;
                state.next_attempt = None;
                let jetstream = jetstream::ContextBuilder::new()
                    .timeout(self.options.request_timeout)
                    .max_ack_inflight(MAX_ACK_INFLIGHT)
                    .build(client.clone());
                tracing::debug!(messaging.destination.name = %self.name, "nats connected");
                Ok((client, jetstream))
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                let backoff = Backoff::new(RECONNECT_BASE, self.options.max_backoff)
                    .delay(state.failures.saturating_sub(1));
                state.next_attempt = Some(Instant::now() + backoff);
                tracing::warn!(messaging.destination.name = %self.name, failures = state.failures, ?backoff, error = %e, "nats connect failed");
                Err(e)
            }
        }
    }

    fn stream_config(&self) -> stream::Config {
        let o = &self.options;
        stream::Config {
            name: o.stream.clone(),
            subjects: vec![o.subject.clone(), o.delay_subject_name()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: match o.storage {
                crate::StorageType::File => stream::StorageType::File,
                crate::StorageType::Memory => stream::StorageType::Memory,
            },
            num_replicas: usize::from(o.replicas),
            duplicate_window: o.duplicate_window,
            ..stream::Config::default()
        }
    }

    /// The consumer workers pull from, and the delay consumer (delayed messages waiting for
    /// their time, `max_delayed` of them at once).
    fn consumer_configs(&self) -> [consumer::pull::Config; 2] {
        let o = &self.options;
        let config = |name: String, subject: String, max_ack_pending: u32| consumer::pull::Config {
            durable_name: Some(name),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: o.ack_wait,
            max_deliver: -1,
            max_ack_pending: i64::from(max_ack_pending),
            filter_subject: subject,
            deliver_policy: consumer::DeliverPolicy::All,
            ..consumer::pull::Config::default()
        };
        [
            config(o.consumer.clone(), o.subject.clone(), o.max_ack_pending),
            config(
                o.delay_consumer_name(),
                o.delay_subject_name(),
                o.max_delayed,
            ),
        ]
    }

    /// Creates or updates the stream (a work queue: an acked message is deleted), the durable
    /// pull consumer and the delay consumer; returns both consumers. Idempotent.
    pub(crate) async fn declare(
        &self,
        jetstream: &jetstream::Context,
    ) -> Result<(PullConsumer, PullConsumer), TransportError> {
        let stream_name = &self.options.stream;
        jetstream
            .create_or_update_stream(self.stream_config())
            .await
            .map_err(|e| {
                nats_error(
                    &self.name,
                    create_stream_kind(&e.kind()),
                    format!("cannot create or update stream `{stream_name}`"),
                    e,
                )
            })?;
        let stream = self.stream(jetstream).await?;
        let [main, delayed] = self.consumer_configs();
        let mut made = Vec::with_capacity(2);
        for config in [main, delayed] {
            let name = config.durable_name.clone().unwrap_or_default();
            let consumer = stream.create_consumer(config).await.map_err(|e| {
                nats_error(
                    &self.name,
                    consumer_kind(&e.kind()),
                    format!("cannot create or update consumer `{name}` on stream `{stream_name}`"),
                    e,
                )
            })?;
            made.push(consumer);
        }
        let delayed = made.pop();
        match (made.pop(), delayed) {
            (Some(main), Some(delayed)) => Ok((main, delayed)),
            _ => Err(self.error(TransportErrorKind::Protocol, "consumer setup incomplete")),
        }
    }

    async fn lookup(
        &self,
        jetstream: &jetstream::Context,
        consumer: &str,
    ) -> Result<PullConsumer, TransportError> {
        let stream = self.stream(jetstream).await?;
        stream.get_consumer(consumer).await.map_err(|e| {
            // async-nats boxes this error; the connection was up a moment ago, so a missing
            // consumer is the likely cause.
            TransportError::new(TransportErrorKind::NotFound, self.name.clone())
                .with_context(format!(
                    "cannot look up consumer `{consumer}` on stream `{}` (run setup, or enable auto_setup)",
                    self.options.stream
                ))
                .with_source(e)
        })
    }

    pub(crate) async fn stream(
        &self,
        jetstream: &jetstream::Context,
    ) -> Result<stream::Stream, TransportError> {
        jetstream
            .get_stream(&self.options.stream)
            .await
            .map_err(|e| {
                nats_error(
                    &self.name,
                    get_stream_kind(&e.kind()),
                    format!("cannot look up stream `{}`", self.options.stream),
                    e,
                )
            })
    }

    /// The number of messages in the stream (a work queue: waiting, in flight and delayed).
    pub(crate) async fn stream_messages(&self) -> Result<u64, TransportError> {
        let (_, jetstream) = self.client().await?;
        let stream = self.stream(&jetstream).await?;
        let info = stream.get_info().await.map_err(|e| {
            nats_error(
                &self.name,
                info_kind(&e.kind()),
                format!("cannot read stream `{}`", self.options.stream),
                e,
            )
        })?;
        Ok(info.state.messages)
    }

    /// Sets up again on the current connection (for [`Setup`](courier_core::Setup)).
    pub(crate) async fn setup(&self) -> Result<(), TransportError> {
        let (client, jetstream) = self.client().await?;
        let (consumer, delayed) = self.declare(&jetstream).await?;
        let mut state = self.state.lock().await;
        state.session = Some(Session {
            client,
            jetstream,
            consumer,
        });
        state.delayed = Some(delayed);
        Ok(())
    }

    /// Deletes the stream with its messages and consumer (tests and teardown).
    pub(crate) async fn delete_stream(&self) -> Result<(), TransportError> {
        let (_, jetstream) = self.client().await?;
        self.invalidate().await;
        match jetstream.delete_stream(&self.options.stream).await {
            Ok(_) => Ok(()),
            Err(e) => Err(nats_error(
                &self.name,
                TransportErrorKind::Protocol,
                format!("cannot delete stream `{}`", self.options.stream),
                e,
            )),
        }
    }

    /// Drains and closes the connection (a later call connects again).
    pub(crate) async fn close(&self) {
        let mut state = self.state.lock().await;
        state.session = None;
        state.delayed = None;
        if let Some((client, _)) = state.client.take() {
            let _ = client.drain().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_shows_in_debug() {
        let server = Server {
            address: "127.0.0.1:4222".into(),
            user: Some("app".into()),
            password: Some("hunter2".into()),
        };
        let shown = format!("{server:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let link = Link::new("orders".into(), server, NatsOptions::new("orders"));
        let shown = format!("{link:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
