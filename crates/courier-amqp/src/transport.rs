//! [`AmqpTransport`]: the [`Transport`] implementation.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    Capabilities, DelayStamp, DeliveryTagStamp, Dsn, Envelope, MessageCount, MessageRegistry,
    PriorityStamp, Setup, Stamp, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp, async_trait, encode_with,
};
use lapin::options::BasicPublishOptions;
use lapin::{Confirmation, PublisherConfirm};
use serde::{Deserialize, Serialize};

use crate::AmqpOptions;
use crate::delay::{self, DELAY_HEADER, DelayRoute, MAX_DELAY};
use crate::inbox::{Inbox, Received};
use crate::link::{Link, Session, amqp_error};
use crate::wire;

/// The queue an envelope was received from (local). [`AmqpTransport::retry`] uses it to route
/// the retry to that queue only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmqpReceivedStamp {
    /// The queue's name.
    pub queue: String,
}

impl Stamp for AmqpReceivedStamp {
    const NAME: &'static str = "amqp-received";
    const SENDABLE: bool = false;
}

/// Where a publish goes.
enum Target<'a> {
    /// The transport's exchange, with its routing key (fan-out to every bound queue).
    Exchange,
    /// One queue, through the default exchange.
    Queue(&'a str),
}

/// The AMQP 0-9-1 transport (RabbitMQ), on lapin. See the [crate docs](crate).
pub struct AmqpTransport {
    link: Arc<Link>,
    inbox: Arc<Inbox>,
    registry: Arc<MessageRegistry>,
    capabilities: Capabilities,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("name", &self.link.name())
            .field("exchange", &self.link.options.exchange)
            .finish_non_exhaustive()
    }
}

impl AmqpTransport {
    /// A transport named `name` for the broker at `uri` (`amqp://user:pass@host:port/vhost`,
    /// without Courier's options). Connects lazily, on first use.
    #[must_use]
    pub fn new(
        name: impl Into<String>,
        uri: impl Into<String>,
        options: AmqpOptions,
        registry: Arc<MessageRegistry>,
    ) -> Self {
        let priority = options.queues.iter().any(crate::QueueOptions::has_priority);
        let mut capabilities = Capabilities::none()
            .with_delay(Some(MAX_DELAY))
            .with_get_wait(options.poll_window)
            .with_redelivery();
        // Prefetch 0 is no bound at all.
        capabilities = match options.prefetch {
            0 => capabilities,
            n => capabilities.with_unacked_window(usize::from(n)),
        };
        if priority {
            capabilities = capabilities.with_priority();
        }
        Self {
            link: Arc::new(Link::new(uri.into(), name.into(), options)),
            inbox: Arc::new(Inbox::default()),
            registry,
            capabilities,
        }
    }

    /// Builds the transport from a DSN with its options (see [`AmqpOptions`]) and connects.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for bad options, a connection error when the broker is
    /// unreachable.
    pub async fn connect(
        name: &str,
        dsn: &Dsn,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let options = AmqpOptions::from_dsn(name, dsn).map_err(|reason| {
            TransportError::new(TransportErrorKind::Config, name.to_owned())
                .with_context(format!("DSN `{dsn}`: {reason}"))
        })?;
        let transport = Self::new(name, dsn.expose_without_query(), options, registry);
        transport.link.session().await?;
        Ok(transport)
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &AmqpOptions {
        &self.link.options
    }

    /// Closes the consuming channel without acking anything: the broker requeues every
    /// delivery not yet acked, as when a consumer dies. The next `get` opens a new channel.
    pub async fn close_consumer(&self) {
        self.inbox.close().await;
    }

    /// Deletes what this transport declared: its queues (with their messages), the delay bucket
    /// queues this process declared, the delay exchange and the exchange. For tests and
    /// teardown; the next operation re-declares them when `auto_setup` is on.
    ///
    /// # Errors
    /// A connection or protocol error.
    pub async fn delete_topology(&self) -> Result<(), TransportError> {
        self.inbox.close().await;
        self.link.delete_topology().await
    }

    /// Closes the consumer and the connection (a later call reconnects).
    pub async fn close(&self) {
        self.inbox.close().await;
        self.link.close().await;
    }

    fn name(&self) -> &str {
        self.link.name()
    }

    fn error(&self, kind: TransportErrorKind, context: impl Into<String>) -> TransportError {
        TransportError::new(kind, self.name().to_owned()).with_context(context.into())
    }

    /// Publishes one envelope (mandatory, so an unroutable message is an error, not a loss) and
    /// returns its confirm future and message id.
    async fn publish(
        &self,
        session: &Session,
        envelope: &Envelope,
        target: &Target<'_>,
    ) -> Result<(PublisherConfirm, String), TransportError> {
        self.capabilities.check_delay(self.name(), envelope)?;
        let encoded = encode_with(envelope, self.link.options.serializer).map_err(|e| {
            TransportError::new(TransportErrorKind::Encode, self.name().to_owned()).with_source(e)
        })?;
        let o = &self.link.options;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let delay = envelope
            .last::<DelayStamp>()
            .map(|d| d.0)
            .filter(|d| !d.is_zero());
        let priority = envelope.last::<PriorityStamp>().map(|p| p.0);
        let (exchange, routing_key, extra) = match (target, delay) {
            (Target::Exchange, None) => (o.exchange.clone(), o.routing_key.clone(), None),
            (Target::Queue(q), None) => (String::new(), (*q).to_owned(), None),
            (target, Some(d)) => {
                let (route, key) = match target {
                    Target::Exchange => (DelayRoute::Exchange, o.routing_key.clone()),
                    Target::Queue(q) => (DelayRoute::Queue, (*q).to_owned()),
                };
                let bucket = delay::bucket(d);
                self.link.ensure_delay_queue(session, route, bucket).await?;
                (
                    delay::delay_exchange(&o.exchange),
                    key,
                    Some((DELAY_HEADER, route.header_value(bucket))),
                )
            }
        };
        let out = wire::outgoing(encoded, &id, o.persistent, priority, extra);
        let confirm = session
            .publisher
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &out.body,
                out.properties,
            )
            .await;
        match confirm {
            Ok(c) => Ok((c, id)),
            Err(e) => {
                self.link.invalidate().await;
                Err(amqp_error(self.name(), "basic.publish failed", e))
            }
        }
    }

    /// Waits for one publisher confirm.
    async fn confirmed(&self, confirm: PublisherConfirm) -> Result<(), TransportError> {
        match confirm.await {
            Err(e) => {
                self.link.invalidate().await;
                Err(amqp_error(self.name(), "publisher confirm failed", e))
            }
            Ok(Confirmation::Nack(_)) => {
                Err(self.error(TransportErrorKind::Protocol, "the broker refused the message (basic.nack)"))
            }
            Ok(c @ (Confirmation::Ack(_) | Confirmation::NotRequested)) => match c.take_message() {
                Some(returned) => Err(self.error(
                    TransportErrorKind::NotFound,
                    format!(
                        "message unroutable ({}): no queue is bound to exchange `{}` for routing key `{}`",
                        returned.reply_text, returned.delivery.exchange, returned.delivery.routing_key
                    ),
                )),
                None => Ok(()),
            },
        }
    }

    async fn with_timeout<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, TransportError>>,
    ) -> Result<T, TransportError> {
        match tokio::time::timeout(self.link.options.confirm_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(self.error(
                TransportErrorKind::Timeout,
                format!(
                    "no publisher confirm within {:?}",
                    self.link.options.confirm_timeout
                ),
            )),
        }
    }

    async fn send_to(
        &self,
        envelope: Envelope,
        target: &Target<'_>,
    ) -> Result<Envelope, TransportError> {
        let session = self.link.session().await?;
        let (confirm, id) = self.publish(&session, &envelope, target).await?;
        self.with_timeout(self.confirmed(confirm)).await?;
        Ok(envelope.with(TransportMessageIdStamp(id)))
    }

    fn envelope(&self, r: Received) -> Envelope {
        let Received {
            queue,
            generation,
            delivery,
        } = r;
        let tag = format!("{generation}.{}", delivery.delivery_tag);
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map_or_else(|| tag.clone(), |m| m.as_str().to_owned());
        let queue = self
            .link
            .options
            .queues
            .get(queue)
            .map(|q| q.name.clone())
            .unwrap_or_default();
        let headers = wire::incoming(&delivery.properties);
        self.registry
            .decode_bytes(delivery.data, headers)
            .with(TransportMessageIdStamp(id))
            .with(DeliveryTagStamp(tag))
            .with(AmqpReceivedStamp { queue })
    }

    fn tag_of(&self, envelope: &Envelope) -> Result<(u64, u64), TransportError> {
        envelope
            .last::<DeliveryTagStamp>()
            .and_then(|t| t.0.split_once('.'))
            .and_then(|(g, t)| Some((g.parse().ok()?, t.parse().ok()?)))
            .ok_or_else(|| {
                self.error(
                    TransportErrorKind::NotFound,
                    "the envelope carries no AMQP delivery tag of this transport",
                )
            })
    }
}

/// One of the transport's queues (`consume --queues`): a transport on its own connection that
/// consumes that queue only; what it sends still goes to the exchange.
#[async_trait]
impl courier_core::Queues for AmqpTransport {
    async fn queue(&self, queue: &str) -> Result<Arc<dyn Transport>, TransportError> {
        let (uri, name) = self.link.identity();
        let queues = self.link.options.queue_options();
        let Some(chosen) = queues.iter().find(|q| q.name() == queue) else {
            let known: Vec<&str> = queues.iter().map(crate::QueueOptions::name).collect();
            return Err(
                TransportError::new(TransportErrorKind::Config, name.to_owned()).with_context(
                    format!("no queue `{queue}` (its queues: {})", known.join(", ")),
                ),
            );
        };
        let options = self.link.options.clone().queues([chosen.clone()]);
        let view = Self::new(name, uri, options, self.registry.clone());
        view.link.session().await?;
        Ok(Arc::new(view))
    }
}

#[async_trait]
impl Transport for AmqpTransport {
    fn messaging_system(&self) -> &'static str {
        "rabbitmq"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.send_to(envelope, &Target::Exchange).await
    }

    #[tracing::instrument(level = "debug", name = "receive", skip_all, fields(
        otel.name = %format_args!("receive {}", self.name()),
        messaging.system = "rabbitmq",
        messaging.destination.name = %self.name(),
        messaging.operation.type = "receive",
        messaging.operation.name = "receive",
    ))]
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let received = self
            .inbox
            .get(&self.link, max, self.link.options.poll_window)
            .await?;
        Ok(received.into_iter().map(|r| self.envelope(r)).collect())
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let tag = self.tag_of(envelope)?;
        self.inbox.settle(&self.link, &[tag], true).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let tag = self.tag_of(envelope)?;
        self.inbox.settle(&self.link, &[tag], false).await
    }

    /// Publishes the retry to the queue the envelope came from only (through the default
    /// exchange, or that queue's delay bucket), waits for its confirm, then acks the original.
    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let next = envelope.clone().without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        match envelope
            .last::<AmqpReceivedStamp>()
            .filter(|s| !s.queue.is_empty())
        {
            Some(s) => self.send_to(next, &Target::Queue(&s.queue)).await?,
            None => self.send_to(next, &Target::Exchange).await?,
        };
        self.ack(&envelope).await
    }

    /// Publishes all, then waits for all confirms (one wait for the whole batch).
    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        let session = self.link.session().await?;
        let mut pending = Vec::with_capacity(envelopes.len());
        for envelope in &envelopes {
            pending.push(self.publish(&session, envelope, &Target::Exchange).await?);
        }
        let (confirms, ids): (Vec<_>, Vec<_>) = pending.into_iter().unzip();
        self.with_timeout(async {
            for result in
                futures_util::future::join_all(confirms.into_iter().map(|c| self.confirmed(c)))
                    .await
            {
                result?;
            }
            Ok(())
        })
        .await?;
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .map(|(e, id)| e.with(TransportMessageIdStamp(id)))
            .collect())
    }

    /// One `basic.ack(multiple)` for the run of contiguous tags, single acks for the rest.
    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let tags = envelopes
            .iter()
            .map(|e| self.tag_of(e))
            .collect::<Result<Vec<_>, _>>()?;
        self.inbox.settle(&self.link, &tags, true).await
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.message_count = Some(self);
        abilities.queues = Some(self);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }
}

#[async_trait]
impl Setup for AmqpTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        let session = self.link.session().await?;
        self.link.declare(&session).await
    }
}

#[async_trait]
impl MessageCount for AmqpTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        self.inbox.message_count(&self.link).await
    }
}
