//! [`NatsTransport`]: the [`Transport`] implementation.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use courier_core::{
    Capabilities, DeliveryTagStamp, Dsn, Envelope, MessageCount, MessageRegistry, Setup, Transport,
    TransportError, TransportErrorKind, TransportMessageIdStamp, async_trait,
};
use futures_util::StreamExt;
use tokio::time::Instant;

use crate::NatsOptions;
use crate::delayed::{self, Promoter};
use crate::deliveries::Deliveries;
use crate::errors::{nats_error, request_kind};
use crate::link::{Link, PullConsumer, Server, Session};
use crate::wire::{self, AckSubject};

mod publish;

/// `send_batch` publishes this many, then awaits their PubAcks, then the next chunk.
const PUBLISH_CHUNK: usize = 1024;

/// Below this much of the poll window left, `get` does not start another waiting pull.
const MIN_WAIT: Duration = Duration::from_millis(20);

/// How long past its expiry a waiting pull may take to end before `get` stops waiting.
const WAIT_SLACK: Duration = Duration::from_secs(1);

/// The NATS JetStream transport, on async-nats. See the [crate docs](crate).
pub struct NatsTransport {
    link: Arc<Link>,
    deliveries: Deliveries,
    promoter: Promoter,
    registry: Arc<MessageRegistry>,
    capabilities: Capabilities,
}

impl std::fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsTransport")
            .field("name", &self.link.name())
            .field("server", &self.link.server().address)
            .field("stream", &self.link.options.stream)
            .finish_non_exhaustive()
    }
}

impl NatsTransport {
    /// A transport named `name` for the server of `dsn` (`nats://[user:pass@]host[:port]`; the
    /// DSN's query is not read: `options` are used). Connects lazily, on first use.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for a DSN with a user but no password (a token belongs in
    /// `?token=`, where it is redacted) or invalid options.
    pub fn new(
        name: impl Into<String>,
        dsn: &Dsn,
        options: NatsOptions,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let name = name.into();
        let config = |reason: String| {
            TransportError::new(TransportErrorKind::Config, name.clone()).with_context(reason)
        };
        options.validate().map_err(config)?;
        if dsn.user().is_some() && dsn.password().is_none() {
            // The DSN is not named: what stands in the user's place may be a token.
            return Err(config(
                "the NATS DSN has a user but no password; pass a token as `?token=...`".into(),
            ));
        }
        let host = dsn.host().filter(|h| !h.is_empty()).unwrap_or("127.0.0.1");
        let port = dsn.port().unwrap_or(4222);
        let address = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let server = Server {
            address,
            user: dsn.user().map(str::to_owned),
            password: dsn.password().map(str::to_owned),
        };
        let capabilities = Capabilities::none()
            .with_delay(None)
            .with_get_wait(options.poll_window)
            .with_redeliver_after(options.ack_wait);
        Ok(Self {
            deliveries: Deliveries::new(options.ack_wait),
            link: Arc::new(Link::new(name, server, options)),
            promoter: Promoter::default(),
            registry,
            capabilities,
        })
    }

    /// Builds the transport from a DSN with its options (see [`NatsOptions`]) and connects
    /// (setting the stream and consumer up when `auto_setup`).
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for bad options, a connection error when the server is
    /// unreachable.
    pub async fn connect(
        name: &str,
        dsn: &Dsn,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let options = NatsOptions::from_dsn(name, dsn).map_err(|reason| {
            TransportError::new(TransportErrorKind::Config, name.to_owned())
                .with_context(format!("DSN `{dsn}`: {reason}"))
        })?;
        let transport = Self::new(name, dsn, options, registry)?;
        transport.link.session().await?;
        Ok(transport)
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &NatsOptions {
        &self.link.options
    }

    /// Gives back every delivery this transport holds (a `-NAK` each), as a consumer that
    /// stops would: the server delivers them again at once, to any consumer. Returns how many
    /// were released.
    ///
    /// # Errors
    /// A connection error; the deliveries not released come back after `ack_wait`.
    pub async fn release_deliveries(&self) -> Result<usize, TransportError> {
        let replies = self.deliveries.all();
        for reply in &replies {
            self.settle(reply, "-NAK").await?;
            if let Some(ack) = AckSubject::parse(reply) {
                self.deliveries.settled(ack);
            }
        }
        Ok(replies.len())
    }

    /// Deletes the stream, with its messages and consumer. For tests and teardown; the next
    /// operation creates them again when `auto_setup` is on.
    ///
    /// # Errors
    /// A connection or protocol error.
    pub async fn delete_stream(&self) -> Result<(), TransportError> {
        self.link.delete_stream().await
    }

    /// Stops promoting due delayed messages, then drains and closes the connection (a later
    /// call connects again, and a later `get` promotes again).
    pub async fn close(&self) {
        self.promoter.stop();
        self.link.close().await;
    }

    fn name(&self) -> &str {
        self.link.name()
    }

    fn error(&self, kind: TransportErrorKind, context: impl Into<String>) -> TransportError {
        TransportError::new(kind, self.name().to_owned()).with_context(context.into())
    }

    /// Pulls up to `n` messages: at once (`no_wait`) without `wait`, else waiting up to it.
    async fn fetch(
        &self,
        consumer: &PullConsumer,
        n: usize,
        wait: Option<Duration>,
    ) -> Result<Vec<async_nats::jetstream::Message>, TransportError> {
        let disconnects = self.link.disconnects();
        let request = match wait {
            None => consumer.fetch().max_messages(n).messages().await,
            Some(wait) => {
                consumer
                    .batch()
                    .max_messages(n)
                    .expires(wait)
                    .messages()
                    .await
            }
        };
        let mut batch = request.map_err(|e| {
            use async_nats::jetstream::consumer::pull::BatchErrorKind as K;
            let kind = match e.kind() {
                K::Subscribe | K::Pull | K::Flush => TransportErrorKind::Connection,
                K::Serialize => TransportErrorKind::Protocol,
            };
            nats_error(self.name(), kind, "pull request failed", e)
        })?;
        // The server ends a batch itself (a waiting pull with a 408 at its expiry); this bounds
        // it should that never come, as when the connection broke under the pull.
        let deadline = Instant::now()
            + match wait {
                Some(wait) => wait + WAIT_SLACK,
                None => self.link.options.request_timeout,
            };
        let mut got = Vec::with_capacity(n);
        loop {
            let next = tokio::time::timeout_at(deadline, batch.next());
            let Some(next) = Link::unless_disconnected(disconnects.clone(), next).await else {
                // What came is still deliverable: deliveries are server state.
                if got.is_empty() {
                    return Err(self.link.disconnected("a pull request"));
                }
                return Ok(got);
            };
            match next {
                Ok(Some(Ok(message))) => got.push(message),
                Ok(None) => return Ok(got),
                Ok(Some(Err(e))) => {
                    if !got.is_empty() {
                        return Ok(got);
                    }
                    // The consumer may have been deleted: look it up (or set it up) again.
                    self.link.invalidate().await;
                    return Err(self
                        .error(TransportErrorKind::Connection, "pull request failed")
                        .with_source(e));
                }
                Err(_) if !got.is_empty() || wait.is_some() => return Ok(got),
                Err(_) => {
                    return Err(self.error(
                        TransportErrorKind::Timeout,
                        "the server did not answer a pull request in time",
                    ));
                }
            }
        }
    }

    /// Turns pulled messages into envelopes; a message whose delay has not passed yet (one
    /// published on the subject with the delay header by another producer) is moved to the
    /// delay subject, and not returned.
    async fn ready(
        &self,
        session: &Session,
        messages: Vec<async_nats::jetstream::Message>,
    ) -> Vec<Envelope> {
        let now = delayed::now_nanos();
        let mut out = Vec::with_capacity(messages.len());
        let mut early = Vec::new();
        for message in messages {
            let message = message.message;
            let Some(reply) = message.reply.as_ref().map(|r| r.as_str().to_owned()) else {
                continue;
            };
            let Some(ack) = AckSubject::parse(&reply) else {
                tracing::warn!(messaging.destination.name = %self.name(), reply = %reply, "nats message with an unknown ack subject left for redelivery");
                continue;
            };
            let (headers, delay) = wire::incoming(message.headers.as_ref());
            if let Some(left) = delayed::left(ack, delay, now) {
                early.push((reply, ack, left, message));
                continue;
            }
            self.deliveries.received(ack, &reply);
            let envelope = self
                .registry
                .decode_bytes(message.payload.to_vec(), headers)
                .with(TransportMessageIdStamp(ack.stream_seq.to_string()))
                .with(DeliveryTagStamp(reply));
            out.push(envelope);
        }
        if !early.is_empty() {
            self.move_delayed(session, early).await;
        }
        out
    }

    /// Moves delayed messages found on the subject workers pull from to the delay subject
    /// (published with what is left of their delay, then acked), so they wait outside this
    /// consumer's pending window. One whose move fails is given back with a `-NAK` delayed by
    /// what is left, as a last resort (it waits in the window then).
    async fn move_delayed(
        &self,
        session: &Session,
        early: Vec<(String, AckSubject, Duration, async_nats::Message)>,
    ) {
        let o = &self.link.options;
        let subject = o.delay_subject_name();
        let disconnects = self.link.disconnects();
        let mut pending = Vec::with_capacity(early.len());
        for (_, ack, left, message) in &early {
            let headers = wire::forwarded(
                message.headers.as_ref(),
                Some(*left),
                format!("courier-moved:{}", ack.stream_seq),
            );
            let publish = PublishMessage::build()
                .payload(message.payload.clone())
                .headers(headers);
            pending.push(
                session
                    .jetstream
                    .send_publish(subject.clone(), publish)
                    .await,
            );
        }
        let confirms = futures_util::future::join_all(pending.into_iter().map(|sent| async move {
            match sent {
                Ok(ack) => ack.await.map(|_| ()),
                Err(e) => Err(e),
            }
        }));
        let confirmed = Link::unless_disconnected(disconnects, confirms)
            .await
            .unwrap_or_default();
        let mut settles = Vec::with_capacity(early.len());
        for (i, (reply, _, left, _)) in early.into_iter().enumerate() {
            match confirmed.get(i) {
                Some(Ok(())) => settles.push(async move { self.settle(&reply, "+ACK").await }),
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(messaging.destination.name = %self.name(), subject = %subject, error = %e, "nats delayed message not moved to the delay subject; it waits its delay in the pending window");
                    }
                    let nak = delayed::nak_after(left);
                    if let Err(e) = session.client.publish(reply, nak.into()).await {
                        tracing::warn!(messaging.destination.name = %self.name(), error = %e, "nats delayed message not given back; it returns after ack_wait");
                    }
                }
            }
        }
        for result in futures_util::future::join_all(settles).await {
            if let Err(e) = result {
                // Moved but not acked: it comes back after ack_wait, and the move is
                // deduplicated within the duplicate window.
                tracing::warn!(messaging.destination.name = %self.name(), error = %e, "nats delayed message moved but its ack failed");
            }
        }
    }

    /// The ack subject of a received envelope.
    fn delivery_of<'e>(
        &self,
        envelope: &'e Envelope,
    ) -> Result<(&'e str, AckSubject), TransportError> {
        envelope
            .last::<DeliveryTagStamp>()
            .and_then(|t| Some((t.0.as_str(), AckSubject::parse(&t.0)?)))
            .ok_or_else(|| {
                self.error(
                    TransportErrorKind::NotFound,
                    "the envelope carries no JetStream ack subject of this transport",
                )
            })
    }

    /// Sends `+ACK`, `+TERM`, `+WPI` or `-NAK` for a delivery and waits for the server's
    /// answer.
    async fn settle(&self, reply: &str, what: &'static str) -> Result<(), TransportError> {
        let (client, _) = self.link.client().await?;
        let disconnects = self.link.disconnects();
        let request = client.request(reply.to_owned(), what.into());
        let answer = tokio::time::timeout(self.link.options.request_timeout, request);
        let Some(answer) = Link::unless_disconnected(disconnects, answer).await else {
            return Err(self.link.disconnected(what));
        };
        match answer {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(nats_error(
                self.name(),
                request_kind(&e.kind()),
                format!("`{what}` of a delivery failed"),
                e,
            )),
            Err(_) => Err(self.error(
                TransportErrorKind::Timeout,
                format!("no answer to `{what}` of a delivery in time"),
            )),
        }
    }

    /// Acks or rejects one delivery; a superseded one only locally.
    async fn finish(&self, envelope: &Envelope, what: &'static str) -> Result<(), TransportError> {
        let (reply, ack) = self.delivery_of(envelope)?;
        if self.deliveries.superseded(ack) {
            tracing::debug!(messaging.destination.name = %self.name(), stream_seq = ack.stream_seq, "settling a superseded nats delivery: nothing to do");
            return Ok(());
        }
        self.settle(reply, what).await?;
        self.deliveries.settled(ack);
        Ok(())
    }
}

#[async_trait]
impl Transport for NatsTransport {
    fn messaging_system(&self) -> &'static str {
        "nats"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let session = self.link.session().await?;
        let disconnects = self.link.disconnects();
        let ack = self.publish(&session, &envelope).await?;
        let Some(seq) = Link::unless_disconnected(disconnects, self.confirmed(ack)).await else {
            return Err(self
                .link
                .disconnected("a publish (it may have been stored)"));
        };
        Ok(envelope.with(TransportMessageIdStamp(seq?.to_string())))
    }

    #[tracing::instrument(level = "debug", name = "receive", skip_all, fields(
        otel.name = %format_args!("receive {}", self.name()),
        messaging.system = "nats",
        messaging.destination.name = %self.name(),
        messaging.operation.type = "receive",
        messaging.operation.name = "receive",
    ))]
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let session = self.link.session().await?;
        self.promoter.ensure(&self.link);
        let deadline = Instant::now() + self.link.options.poll_window;
        loop {
            let mut pulled = self.fetch(&session.consumer, max, None).await?;
            if pulled.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left < MIN_WAIT {
                    return Ok(Vec::new());
                }
                // One message, waited for: a larger waiting pull would stay open on the server
                // after this returns, and what it delivered later would wait out `ack_wait`.
                pulled = self.fetch(&session.consumer, 1, Some(left)).await?;
                if !pulled.is_empty() && max > 1 {
                    pulled.extend(self.fetch(&session.consumer, max - 1, None).await?);
                }
            }
            let ready = self.ready(&session, pulled).await;
            if !ready.is_empty() || Instant::now() >= deadline {
                return Ok(ready);
            }
        }
    }

    /// `+ACK`, confirmed by the server. Acking twice, or a superseded delivery, is a no-op.
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.finish(envelope, "+ACK").await
    }

    /// `+TERM`: never delivered again (the work-queue stream deletes it).
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.finish(envelope, "+TERM").await
    }

    /// `+WPI` (work in progress): the server restarts the delivery's `ack_wait`.
    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let (reply, ack) = self.delivery_of(envelope)?;
        if self.deliveries.superseded(ack) {
            return Ok(());
        }
        self.settle(reply, "+WPI").await?;
        self.deliveries.touched(ack);
        Ok(())
    }

    /// All the `+WPI`s at once, each confirmed.
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let keepalives = envelopes.iter().map(|e| self.keepalive(e));
        for result in futures_util::future::join_all(keepalives).await {
            result?;
        }
        Ok(())
    }

    /// Publishes in chunks of 1024, then awaits each chunk's PubAcks together.
    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        let session = self.link.session().await?;
        let mut seqs = Vec::with_capacity(envelopes.len());
        for chunk in envelopes.chunks(PUBLISH_CHUNK) {
            let disconnects = self.link.disconnects();
            let mut pending = Vec::with_capacity(chunk.len());
            for envelope in chunk {
                pending.push(self.publish(&session, envelope).await?);
            }
            let confirms =
                futures_util::future::join_all(pending.into_iter().map(|a| self.confirmed(a)));
            let Some(results) = Link::unless_disconnected(disconnects, confirms).await else {
                return Err(self
                    .link
                    .disconnected("a batch of publishes (some may have been stored)"));
            };
            for result in results {
                seqs.push(result?);
            }
        }
        Ok(envelopes
            .into_iter()
            .zip(seqs)
            .map(|(e, seq)| e.with(TransportMessageIdStamp(seq.to_string())))
            .collect())
    }

    /// All the acks at once, each confirmed.
    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let acks = envelopes.iter().map(|e| self.finish(e, "+ACK"));
        for result in futures_util::future::join_all(acks).await {
            result?;
        }
        Ok(())
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.message_count = Some(self);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }
}

#[async_trait]
impl Setup for NatsTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        self.link.setup().await
    }
}

#[async_trait]
impl MessageCount for NatsTransport {
    /// The stream's messages: a work queue keeps exactly those not acked or rejected yet
    /// (waiting, in flight and delayed).
    async fn message_count(&self) -> Result<u64, TransportError> {
        self.link.stream_messages().await
    }
}
