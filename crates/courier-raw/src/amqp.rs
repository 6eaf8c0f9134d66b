//! RabbitMQ: the transport's protocol work on lapin, on a connection of its own, with an exchange
//! and a queue of its own (deleted by `cleanup`).

use std::time::Duration;

use courier_core::Dsn;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer,
    ExchangeKind,
};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::{Driver, OnHandled, decode};
use crate::error::{RawError, RawResult};

/// How long `consume` waits for the first delivery (the transport's poll window).
const POLL_WINDOW: Duration = Duration::from_secs(1);

pub(crate) struct Raw {
    connection: Connection,
    publisher: Channel,
    /// The consuming channel and its consumer, opened by the first `consume` (like the
    /// transport's first `get`), so nothing is pushed while the benchmark produces.
    consumer: Mutex<Option<(Channel, Consumer)>>,
    /// The exchange's and the queue's name.
    name: String,
    prefetch: u16,
    properties: BasicProperties,
}

fn err(e: lapin::Error) -> RawError {
    RawError::failed(format!("raw amqp benchmark: {e}"))
}

async fn connect(dsn: &Dsn) -> RawResult<Connection> {
    let props =
        ConnectionProperties::default().with_connection_name(LongString::from("courier:bench_raw"));
    Connection::connect(dsn.expose_without_query(), props)
        .await
        .map_err(err)
}

impl Raw {
    /// Declares a durable fanout exchange and a durable classic queue (version
    /// `CLASSIC_QUEUE_VERSION`) bound to it, and opens the
    /// publishing channel with confirms on; the consumer will use `basic.qos(fetch_size)`.
    pub(super) async fn connect(dsn: &Dsn, fetch_size: usize) -> RawResult<Self> {
        let connection = connect(dsn).await?;
        let name = format!("bench_raw_{}", fastrand::u32(..));
        let setup = connection.create_channel().await.map_err(err)?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        setup
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
        // The same kind of queue the Courier side declares (courier-cli's `bench::isolate`).
        let mut arguments = FieldTable::default();
        arguments.insert(
            ShortString::from("x-queue-version"),
            AMQPValue::LongLongInt(crate::CLASSIC_QUEUE_VERSION),
        );
        setup
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::durable(),
                arguments,
            )
            .await
            .map_err(err)?;
        setup
            .queue_bind(
                name.as_str().into(),
                name.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
        let _ = setup.close(200, "setup done".into()).await;
        let publisher = connection.create_channel().await.map_err(err)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(err)?;
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("type"),
            AMQPValue::LongString(LongString::from("courier.bench")),
        );
        let properties = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_headers(headers);
        Ok(Self {
            connection,
            publisher,
            consumer: Mutex::new(None),
            name,
            prefetch: u16::try_from(fetch_size).unwrap_or(u16::MAX).max(1),
            properties,
        })
    }

    /// Opens a consuming channel: `basic.qos(prefetch)`, `basic.consume` on the queue.
    async fn open_consumer(&self) -> RawResult<(Channel, Consumer)> {
        let channel = self.connection.create_channel().await.map_err(err)?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(err)?;
        let consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
        Ok((channel, consumer))
    }

    /// The latency floor's consumer: the broker pushes, each delivery is decoded, reported and
    /// acked on its own.
    pub(super) async fn push(&self, handled: super::Handled) -> RawResult<JoinHandle<()>> {
        let (channel, mut consumer) = self.open_consumer().await?;
        Ok(tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                match decode(&delivery.data, "amqp") {
                    Ok(seq) => {
                        super::report_handled(&handled, seq);
                    }
                    Err(e) => tracing::warn!(error = %e, "raw amqp latency consumer"),
                }
                if channel
                    .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }))
    }
}

#[courier_core::async_trait]
impl Driver for Raw {
    /// Publishes every body (persistent, mandatory), then waits for all their confirms.
    async fn send(&self, bodies: &[String]) -> RawResult {
        let mut confirms = Vec::with_capacity(bodies.len());
        for body in bodies {
            let properties = self
                .properties
                .clone()
                .with_message_id(ShortString::from(uuid::Uuid::new_v4().simple().to_string()));
            let confirm = self
                .publisher
                .basic_publish(
                    self.name.as_str().into(),
                    "".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    body.as_bytes(),
                    properties,
                )
                .await
                .map_err(err)?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            match confirm.await.map_err(err)? {
                Confirmation::Nack(_) => {
                    return Err(RawError::failed(
                        "raw amqp benchmark: the broker refused a message (basic.nack)",
                    ));
                }
                c => {
                    if c.take_message().is_some() {
                        return Err(RawError::failed(
                            "raw amqp benchmark: a message was unroutable",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes the deliveries already pushed, up to `max` (waiting up to 1 s for the first),
    /// decodes them and acks them with one `basic.ack(multiple)`.
    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize> {
        let mut guard = self.consumer.lock().await;
        if guard.is_none() {
            *guard = Some(self.open_consumer().await?);
        }
        let Some((channel, consumer)) = guard.as_mut() else {
            return Ok(0);
        };
        let first = match tokio::time::timeout(POLL_WINDOW, consumer.next()).await {
            Ok(Some(Ok(delivery))) => delivery,
            Ok(Some(Err(e))) => return Err(err(e)),
            Ok(None) => return Err(RawError::failed("raw amqp benchmark: consumer cancelled")),
            Err(_) => return Ok(0),
        };
        on(decode(&first.data, "amqp")?);
        let mut last = first.delivery_tag;
        let mut n = 1;
        while n < max {
            match consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => {
                    on(decode(&delivery.data, "amqp")?);
                    last = delivery.delivery_tag;
                    n += 1;
                }
                Some(Some(Err(e))) => return Err(err(e)),
                _ => break,
            }
        }
        channel
            .basic_ack(last, BasicAckOptions { multiple: n > 1 })
            .await
            .map_err(err)?;
        Ok(n)
    }

    /// Closes the consuming channel first (nothing is pushed to a closing channel), then
    /// deletes the queue and the exchange, closes the publishing channel and then the
    /// connection: a channel still closing when its connection closes is, to lapin, a
    /// connection error (logged at ERROR).
    async fn cleanup(&self) {
        if let Some((channel, consumer)) = self.consumer.lock().await.take() {
            let _ = channel.close(200, "bench done".into()).await;
            drop(consumer);
        }
        if let Ok(channel) = self.connection.create_channel().await {
            let _ = channel
                .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = channel
                .exchange_delete(self.name.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            // Closed before the connection: a channel still closing when the connection closes
            // is, to lapin, a connection error (logged at ERROR).
            let _ = channel.close(200, "cleanup done".into()).await;
        }
        let _ = self.publisher.close(200, "bench done".into()).await;
        let _ = self.connection.close(200, "bench done".into()).await;
    }
}

/// Deletes these queues and exchanges (what the Courier side of the benchmark declared), on a
/// connection of its own; failures are ignored (nothing to delete, broker gone).
pub async fn delete(dsn: &Dsn, queues: &[&str], exchanges: &[&str]) {
    let Ok(connection) = connect(dsn).await else {
        return;
    };
    if let Ok(channel) = connection.create_channel().await {
        for q in queues {
            let _ = channel
                .queue_delete((*q).into(), QueueDeleteOptions::default())
                .await;
        }
        for ex in exchanges {
            let _ = channel
                .exchange_delete((*ex).into(), ExchangeDeleteOptions::default())
                .await;
        }
        let _ = channel.close(200, "cleanup done".into()).await;
    }
    let _ = connection.close(200, "bench done".into()).await;
}
