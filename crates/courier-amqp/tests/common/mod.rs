//! The RabbitMQ test harness: a transport per test on its own exchange and queues (deleted when
//! the harness drops), raw publishing, consumer death and broker-side connection kills.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test file uses a different part"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_amqp::{AmqpOptions, AmqpTransport, QueueOptions};
use courier_core::{Encoded, Transport, async_trait};
use courier_test::{Harness, Poison};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

pub const OP: Duration = Duration::from_secs(15);

pub struct AmqpHarness {
    pub url: String,
    made: Mutex<Vec<Arc<AmqpTransport>>>,
}

pub async fn harness() -> AmqpHarness {
    AmqpHarness::new()
}

impl AmqpHarness {
    pub fn new() -> Self {
        Self {
            url: courier_test::env::amqp_url(),
            made: Mutex::new(Vec::new()),
        }
    }

    /// A unique transport name (also its exchange's name).
    pub fn unique(prefix: &str) -> String {
        courier_test::env::unique_name(prefix)
    }

    /// Options for a fresh transport: a classic queue with priorities 0..=10.
    pub fn options(name: &str) -> AmqpOptions {
        AmqpOptions::new(name)
            .queues([QueueOptions::new(name).max_priority(10)])
            .poll_window(Duration::from_millis(500))
    }

    /// A set-up transport with these options, torn down when the harness drops.
    pub async fn make(&self, options: AmqpOptions) -> Arc<AmqpTransport> {
        let name = options.exchange_name().to_owned();
        let t = Arc::new(AmqpTransport::new(
            name,
            self.url.clone(),
            options,
            courier_test::registry(),
        ));
        self.made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::clone(&t));
        let setup = t.abilities().setup.expect("amqp has setup");
        tokio::time::timeout(OP, setup.setup())
            .await
            .expect("setup timed out")
            .expect("setup");
        t
    }

    fn find(&self, t: &Arc<dyn Transport>) -> Arc<AmqpTransport> {
        let made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        made.iter()
            .find(|m| std::ptr::addr_eq(Arc::as_ptr(m), Arc::as_ptr(t)))
            .cloned()
            .expect("a transport made by this harness")
    }

    /// Publishes wire-form messages to `exchange` as a producer in another language would.
    pub async fn publish_raw(&self, exchange: &str, routing_key: &str, encoded: Encoded) {
        self.publish_bytes(
            exchange,
            routing_key,
            encoded.body.as_bytes(),
            encoded.headers,
        )
        .await;
    }

    /// Publishes a body of any bytes with these headers (`content-type` as the property).
    pub async fn publish_bytes(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        wire_headers: std::collections::BTreeMap<String, String>,
    ) {
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .expect("connect");
        let ch = conn.create_channel().await.expect("channel");
        let mut headers = FieldTable::default();
        let mut props = BasicProperties::default();
        for (k, v) in wire_headers {
            if k == "content-type" {
                props = props.with_content_type(ShortString::from(v));
            } else {
                headers.insert(
                    ShortString::from(k),
                    AMQPValue::LongString(LongString::from(v)),
                );
            }
        }
        props = props.with_headers(headers).with_delivery_mode(2);
        ch.confirm_select(Default::default())
            .await
            .expect("confirm_select");
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
        assert!(confirm.is_ack());
        let _ = conn.close(200, "done".into()).await;
    }

    /// Closes, from the broker side, every connection of the transport named `name`
    /// (`rabbitmqctl close_connection` on the connections named `courier:<name>`).
    pub fn kill_connections(name: &str) -> usize {
        let out = std::process::Command::new("rabbitmqctl")
            .args(["list_connections", "pid", "client_properties", "-q", "--no-table-headers"])
            .output()
            .expect("rabbitmqctl list_connections (the test needs rabbitmqctl on PATH and rights to run it)");
        let text = String::from_utf8_lossy(&out.stdout);
        let needle = format!("courier:{name}\"");
        let mut killed = 0;
        for line in text.lines().filter(|l| l.contains(&needle)) {
            let Some(pid) = line.split_whitespace().next() else {
                continue;
            };
            let status = std::process::Command::new("rabbitmqctl")
                .args(["close_connection", pid, "killed by a courier test", "-q"])
                .status()
                .expect("rabbitmqctl close_connection");
            assert!(
                status.success(),
                "rabbitmqctl close_connection {pid} failed"
            );
            killed += 1;
        }
        killed
    }
}

impl Drop for AmqpHarness {
    fn drop(&mut self) {
        let made: Vec<_> = std::mem::take(
            &mut *self
                .made
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if made.is_empty() {
            return;
        }
        let cleanup = async move {
            for t in made {
                let _ = tokio::time::timeout(OP, t.delete_topology()).await;
                t.close().await;
            }
        };
        courier_test::block_on_teardown(cleanup);
    }
}

#[async_trait]
impl Harness for AmqpHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        self.make(Self::options(&Self::unique("courier_amqp")))
            .await
    }

    async fn expire_deliveries(&self, transport: &Arc<dyn Transport>) {
        self.find(transport).close_consumer().await;
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        let t = self.find(transport);
        let exchange = t.options().exchange_name().to_owned();
        self.publish_raw(&exchange, "", encoded).await;
    }

    async fn store_poison(&self, transport: &Arc<dyn Transport>, poison: Poison) -> bool {
        let t = self.find(transport);
        let exchange = t.options().exchange_name().to_owned();
        let typed: std::collections::BTreeMap<String, String> = [
            ("type".to_owned(), "courier.test".to_owned()),
            ("content-type".to_owned(), "application/json".to_owned()),
        ]
        .into();
        let (body, headers): (&[u8], _) = match poison {
            Poison::BinaryBody => (courier_test::POISON_BODY, typed),
            Poison::MissingBody => (b"", typed),
            Poison::MissingHeaders => (br#"{"seq":2,"text":"x"}"#, Default::default()),
            // Headers are an AMQP table, never one JSON text.
            _ => return false,
        };
        self.publish_bytes(&exchange, "", body, headers).await;
        true
    }

    async fn break_connection(&self, transport: &Arc<dyn Transport>) -> bool {
        let t = self.find(transport);
        let name = t.options().exchange_name().to_owned();
        let killed = tokio::task::spawn_blocking(move || Self::kill_connections(&name))
            .await
            .expect("join");
        assert!(killed > 0, "no broker connection of this transport to kill");
        true
    }

    fn poll_window(&self) -> Duration {
        Duration::from_millis(500)
    }
}
