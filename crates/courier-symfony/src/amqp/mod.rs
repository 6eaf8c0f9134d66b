//! [`AmqpTransport`]: Symfony Messenger's AMQP transport (RabbitMQ), read and written as PHP's
//! `Bridge\Amqp` does, so that PHP and Courier workers share its exchanges and queues.

mod consumer;
mod dsn;
mod link;
mod options;
mod pending;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use courier_amqp::consume::queued;
use courier_core::{
    Abilities, Capabilities, DelayStamp, Envelope, MessageCount, MessageRegistry, Setup, Transport,
    TransportError, TransportErrorKind, TransportMessageIdStamp,
};
use lapin::BasicProperties;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

pub use dsn::amqp_uri;
pub(crate) use dsn::create;
use link::{Link, Session, amqp_error};
pub use options::{AmqpOptions, AmqpQueue, QueueArgument};

use crate::{SymfonyEncoded, SymfonySerializer};

/// How long a `get` in consumer mode waits for the first message.
const POLL_WINDOW: Duration = Duration::from_secs(1);

/// The longest delay: RabbitMQ's largest `x-message-ttl` (2^32 - 1 ms, about 49 days).
const MAX_DELAY: Duration = Duration::from_millis(u32::MAX as u64);

/// Symfony's content type header, which PHP's `AmqpSender` moves to the `content_type`
/// property.
const CONTENT_TYPE: &str = "Content-Type";

/// Symfony Messenger's AMQP transport: PHP and Courier workers share its exchange and queues.
///
/// - `send` publishes as PHP's `AmqpSender` does: to the exchange with the
///   `default_publish_routing_key` (or none), the Symfony headers as an AMQP table of long
///   strings, `Content-Type` in the `content_type` property, `delivery_mode` 2 (persistent)
///   and `timestamp` now. A message with a `DelayStamp` goes to the delay exchange (direct) with
///   routing key `delay_<exchange>_<routing key>_<ms>_delay`, into a queue of that name which
///   PHP would declare alike (`x-message-ttl` the delay, `x-expires` 10 s more, dead-lettered
///   to the exchange with the original routing key), so it reaches the queues bound to the
///   exchange once due, whichever side sent it. Sends wait for the broker's confirm.
/// - `get` takes messages with `basic.get` from each queue in turn, as PHP's receiver does;
///   with `prefetch_count=N` (consumer mode), from a `basic.consume` on each queue that the
///   broker pushes up to N unacked messages to (see [`AmqpOptions::prefetch_count`]). `ack`
///   acks, `reject` nacks without requeue.
/// - `retry` publishes a new message (the `RedeliveryStamp` the worker added and a
///   `DelayStamp`) as PHP's retry does for a received message: through the delay queue
///   `delay_<exchange>_<queue>_<ms>_retry`, dead-lettered straight into the queue it came from
///   (via the default exchange), then acks the old one.
///
/// A message whose class is not mapped, or whose body does not fit, is received with its
/// decode error (class and reason): the worker moves it to the failure transport and acks it.
#[derive(Debug)]
pub struct AmqpTransport {
    link: Link,
    serializer: SymfonySerializer,
    registry: Arc<MessageRegistry>,
    /// Session generation and delivery tag to the queue the delivery came from.
    pending: Arc<std::sync::Mutex<pending::Pending>>,
    /// Consumer mode (`prefetch_count`).
    consumer: Option<consumer::Consumer>,
}

impl AmqpTransport {
    /// A transport on the broker at `uri` (see [`amqp_uri`]) with `options`. Connects lazily,
    /// on first use; [`AmqpTransport::setup`] connects and declares at once.
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        uri: lapin::uri::AMQPUri,
        options: AmqpOptions,
        serializer: SymfonySerializer,
        registry: Arc<MessageRegistry>,
    ) -> Self {
        let pending = Arc::default();
        Self {
            consumer: options
                .prefetch_count
                .map(|_| consumer::Consumer::new(Arc::clone(&pending))),
            link: Link::new(name.into(), uri, options),
            serializer,
            registry,
            pending,
        }
    }

    /// Connects and declares the exchange, the queues and their bindings (as PHP's `setup`
    /// does; the delay queues are declared when a delayed message is sent).
    ///
    /// # Errors
    /// The broker's error.
    pub async fn setup(&self) -> Result<(), TransportError> {
        self.link
            .with(async |s: &mut Session| self.link.declare(&s.publisher).await)
            .await
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &AmqpOptions {
        &self.link.options
    }

    /// The transport's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.link.name()
    }

    /// Closes the connection (it reopens on next use).
    pub async fn close(&self) {
        self.link.close().await;
    }

    fn error(&self, kind: TransportErrorKind, context: impl Into<String>) -> TransportError {
        TransportError::new(kind, self.name().to_owned()).with_context(context.into())
    }

    fn encode(&self, envelope: &Envelope) -> Result<SymfonyEncoded, TransportError> {
        self.serializer
            .encode(&self.registry, envelope)
            .map_err(|e| {
                TransportError::new(TransportErrorKind::Encode, self.name().to_owned())
                    .with_source(e)
            })
    }

    /// The delivery tag and session generation of a received envelope.
    fn tag(&self, envelope: &Envelope) -> Result<(u64, u64), TransportError> {
        envelope
            .last::<TransportMessageIdStamp>()
            .and_then(|s| {
                let (generation, tag) = s.0.split_once(':')?;
                Some((generation.parse().ok()?, tag.parse().ok()?))
            })
            .ok_or_else(|| {
                self.error(
                    TransportErrorKind::NotFound,
                    "envelope has no delivery tag (TransportMessageIdStamp)",
                )
            })
    }

    /// Publishes `wires` (each with its delay in ms and whether it is a retry into `queue`),
    /// then waits for every confirm.
    async fn publish(
        &self,
        wires: Vec<(SymfonyEncoded, u64, Option<String>)>,
    ) -> Result<(), TransportError> {
        let name = self.name().to_owned();
        self.link
            .with(async |s: &mut Session| {
                let mut confirms = Vec::with_capacity(wires.len());
                for (wire, delay_ms, retry_queue) in &wires {
                    let (exchange, routing_key) =
                        self.route(s, *delay_ms, retry_queue.as_deref()).await?;
                    let (body, properties) = amqp_message(wire)
                        .map_err(|reason| self.error(TransportErrorKind::Encode, reason))?;
                    let confirm = s
                        .publisher
                        .basic_publish(
                            exchange,
                            routing_key,
                            BasicPublishOptions::default(),
                            body.as_bytes(),
                            properties,
                        )
                        .await
                        .map_err(|e| amqp_error(&name, "basic.publish failed", e))?;
                    confirms.push(confirm);
                }
                for confirm in confirms {
                    let confirmation = confirm
                        .await
                        .map_err(|e| amqp_error(&name, "publisher confirm failed", e))?;
                    if confirmation.is_nack() {
                        return Err(self.error(
                            TransportErrorKind::Connection,
                            "the broker refused a message (publisher nack)",
                        ));
                    }
                }
                Ok(())
            })
            .await
    }

    /// The exchange and routing key of a message delayed `delay_ms` (0: none), retried into
    /// `retry_queue` or not: PHP's `publish` / `publishWithDelay`.
    async fn route(
        &self,
        s: &mut Session,
        delay_ms: u64,
        retry_queue: Option<&str>,
    ) -> Result<(ShortString, ShortString), TransportError> {
        let o = &self.link.options;
        let routing_key = retry_queue
            .map(str::to_owned)
            .or_else(|| o.default_publish_routing_key.clone())
            .unwrap_or_default();
        if delay_ms == 0 {
            return Ok((o.exchange_name.as_str().into(), routing_key.as_str().into()));
        }
        let queue = o.delay_queue_name(delay_ms, &routing_key, retry_queue.is_some());
        // A retry goes straight back to its queue through the default exchange.
        let dead_letter_exchange = if retry_queue.is_some() {
            ""
        } else {
            o.exchange_name.as_str()
        };
        self.link
            .declare_delay(s, &queue, delay_ms, (dead_letter_exchange, &routing_key))
            .await?;
        Ok((o.delay_exchange_name.as_str().into(), queue.as_str().into()))
    }

    fn decode(&self, delivery: &lapin::message::Delivery, generation: u64) -> Envelope {
        let mut headers = BTreeMap::new();
        if let Some(table) = delivery.properties.headers() {
            for (key, value) in table.inner() {
                headers.insert(key.as_str().to_owned(), header_text(value));
            }
        }
        if let Some(content_type) = delivery.properties.content_type() {
            headers
                .entry(CONTENT_TYPE.to_owned())
                .or_insert_with(|| content_type.as_str().to_owned());
        }
        let body = String::from_utf8_lossy(&delivery.data).into_owned();
        let encoded = self.serializer.to_courier(body, headers);
        self.registry
            .decode(encoded)
            .with(TransportMessageIdStamp(format!(
                "{generation}:{}",
                delivery.delivery_tag
            )))
    }

    /// Acks (`ack`) or nacks without requeue the deliveries of `envelopes`, all in flight
    /// together. A delivery of an earlier connection is gone already (the broker requeued it
    /// when that one closed).
    async fn settle(&self, envelopes: &[Envelope], ack: bool) -> Result<(), TransportError> {
        let deliveries = envelopes
            .iter()
            .map(|e| self.tag(e))
            .collect::<Result<Vec<_>, _>>()?;
        if deliveries.is_empty() {
            return Ok(());
        }
        let name = self.name().to_owned();
        self.link
            .with(async |s: &mut Session| {
                let generation = s.generation;
                let (current, stale): (Vec<_>, Vec<_>) =
                    deliveries.iter().copied().partition(|(g, _)| *g == generation);
                if !stale.is_empty() {
                    let mut pending = self.lock_pending();
                    for &delivery in &stale {
                        pending.forget(delivery);
                    }
                    tracing::warn!(messaging.destination.name = %name, deliveries = stale.len(), "amqp deliveries of a closed connection not settled: the broker delivers them again");
                }
                let tags: Vec<u64> = current.iter().map(|&(_, tag)| tag).collect();
                let plan = self.lock_pending().plan(generation, &tags, ack);
                // Each frame queued on the channel without waiting for lapin to write it: the
                // broker confirms no settle, and frames leave in the order queued. A frame the
                // connection drops unwritten is lost like one written just before it closed: the
                // broker delivers its message again. A closed channel fails at once.
                let mut failed = None;
                if let Some(to) = plan.multiple_to {
                    match queued(s.getter.basic_ack(to, BasicAckOptions { multiple: true })) {
                        Ok(()) => self.lock_pending().settled_to(generation, to),
                        Err(e) => failed = Some(e),
                    }
                }
                for tag in plan.each {
                    let settled = if ack {
                        queued(s.getter.basic_ack(tag, BasicAckOptions::default()))
                    } else {
                        let requeue = BasicNackOptions {
                            requeue: false,
                            multiple: false,
                        };
                        queued(s.getter.basic_nack(tag, requeue))
                    };
                    match settled {
                        Ok(()) => self.lock_pending().settled(generation, tag),
                        Err(e) => failed = failed.or(Some(e)),
                    }
                }
                match failed {
                    Some(e) => Err(amqp_error(&name, if ack { "basic.ack failed" } else { "basic.nack failed" }, e)),
                    None => Ok(()),
                }
            })
            .await
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, pending::Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A header value as text (Symfony's headers are long strings; others as written).
fn header_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => if *b { "1" } else { "" }.to_owned(),
        AMQPValue::ShortShortInt(i) => i.to_string(),
        AMQPValue::ShortShortUInt(i) => i.to_string(),
        AMQPValue::ShortInt(i) => i.to_string(),
        AMQPValue::ShortUInt(i) => i.to_string(),
        AMQPValue::LongInt(i) => i.to_string(),
        AMQPValue::LongUInt(i) => i.to_string(),
        AMQPValue::LongLongInt(i) => i.to_string(),
        AMQPValue::Timestamp(i) => i.to_string(),
        AMQPValue::Float(f) => f.to_string(),
        AMQPValue::Double(f) => f.to_string(),
        other => format!("{other:?}"),
    }
}

/// The body and properties PHP's `AmqpSender` publishes for `wire`; `Err` names a header
/// whose name AMQP cannot carry (over 255 bytes).
fn amqp_message(wire: &SymfonyEncoded) -> Result<(&str, BasicProperties), String> {
    let mut headers = FieldTable::default();
    let mut content_type = None;
    for (key, value) in &wire.headers {
        if key == CONTENT_TYPE {
            content_type = Some(value.as_str());
        } else {
            let name = ShortString::try_new(key.as_str())
                .map_err(|_| format!("header `{key}` is longer than 255 bytes"))?;
            headers.insert(
                name,
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
    }
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut properties = BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_timestamp(now);
    if let Some(content_type) = content_type.and_then(|c| ShortString::try_new(c).ok()) {
        properties = properties.with_content_type(content_type);
    }
    Ok((wire.body.as_str(), properties))
}

/// The delay of `envelope` in whole milliseconds (PHP's `DelayStamp` holds milliseconds).
fn delay_ms(envelope: &Envelope) -> u64 {
    envelope.last::<DelayStamp>().map_or(0, |DelayStamp(d)| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    })
}

#[async_trait]
impl Transport for AmqpTransport {
    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.capabilities().check_delay(self.name(), &envelope)?;
        let wire = self.encode(&envelope)?;
        self.publish(vec![(wire, delay_ms(&envelope), None)])
            .await?;
        Ok(envelope)
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        let wires = envelopes
            .iter()
            .map(|e| {
                self.capabilities().check_delay(self.name(), e)?;
                Ok((self.encode(e)?, delay_ms(e), None))
            })
            .collect::<Result<Vec<_>, TransportError>>()?;
        self.publish(wires).await?;
        Ok(envelopes)
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let delivery = self.tag(&envelope)?;
        let queue = self.lock_pending().queue_of(delivery).cloned();
        let next = envelope.clone().without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        let wire = self.encode(&next)?;
        self.publish(vec![(wire, delay_ms(&next), queue)]).await?;
        self.ack(&envelope).await
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if let (Some(consumer), Some(prefetch)) = (&self.consumer, self.link.options.prefetch_count)
        {
            let received = consumer.get(&self.link, prefetch, max, POLL_WINDOW).await?;
            let generation = received.generation;
            let mut got = Vec::with_capacity(received.deliveries.len());
            let mut pending = self.lock_pending();
            for (queue, delivery) in &received.deliveries {
                let queue = self.link.options.queues.get(*queue);
                let queue = queue.map(|q| q.name.clone()).unwrap_or_default();
                pending.handed_out(generation, delivery.delivery_tag, queue);
            }
            drop(pending);
            for (_, delivery) in &received.deliveries {
                got.push(self.decode(delivery, generation));
            }
            return Ok(got);
        }
        let name = self.name().to_owned();
        self.link
            .with(async |s: &mut Session| {
                let mut got = Vec::new();
                for queue in &self.link.options.queues {
                    // The `basic.get`s of the rest of the batch in flight together (the broker
                    // answers a channel's requests in order): one round trip, not one each.
                    let asked = max - got.len();
                    let gets = (0..asked).map(|_| {
                        s.getter.basic_get(
                            queue.name.as_str().into(),
                            BasicGetOptions { no_ack: false },
                        )
                    });
                    let mut failed = None;
                    let mut empty = false;
                    for reply in futures_util::future::join_all(gets).await {
                        match reply {
                            // Every delivery is kept, even one after an empty reply or a
                            // failure: it is ours until acked.
                            Ok(Some(message)) => {
                                let delivery = message.delivery;
                                self.lock_pending().handed_out(
                                    s.generation,
                                    delivery.delivery_tag,
                                    queue.name.clone(),
                                );
                                got.push(self.decode(&delivery, s.generation));
                            }
                            Ok(None) => empty = true,
                            Err(e) => failed = failed.or(Some(e)),
                        }
                    }
                    if let Some(e) = failed {
                        if got.is_empty() {
                            return Err(amqp_error(
                                &name,
                                &format!("basic.get from `{}` failed", queue.name),
                                e,
                            ));
                        }
                        // What came is handed out; the next get meets the failure again.
                        break;
                    }
                    if !empty {
                        break;
                    }
                }
                Ok(got)
            })
            .await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.settle(std::slice::from_ref(envelope), true).await
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        self.settle(envelopes, true).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.settle(std::slice::from_ref(envelope), false).await
    }

    fn abilities(&self) -> Abilities<'_> {
        Abilities::none().message_count(self).setup(self)
    }

    fn capabilities(&self) -> Capabilities {
        let capabilities = Capabilities::none()
            .with_delay(Some(MAX_DELAY))
            .with_redelivery();
        match self.link.options.prefetch_count {
            Some(prefetch) => capabilities
                .with_get_wait(POLL_WINDOW)
                .with_unacked_window(usize::from(prefetch)),
            None => capabilities,
        }
    }
}

#[async_trait]
impl Setup for AmqpTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        AmqpTransport::setup(self).await
    }
}

#[async_trait]
impl MessageCount for AmqpTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        let name = self.name().to_owned();
        self.link
            .with(async |s: &mut Session| {
                let mut total = 0u64;
                for queue in &self.link.options.queues {
                    let declared = s
                        .publisher
                        .queue_declare(
                            queue.name.as_str().into(),
                            QueueDeclareOptions {
                                passive: true,
                                ..QueueDeclareOptions::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .map_err(|e| {
                            amqp_error(&name, &format!("cannot count queue `{}`", queue.name), e)
                        })?;
                    total += u64::from(declared.message_count());
                }
                Ok(total)
            })
            .await
    }
}
