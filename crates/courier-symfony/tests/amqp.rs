//! Courier and real Symfony Messenger 5.4 (PHP, Debian's packages, ext-amqp) on one RabbitMQ
//! exchange and queue, laid out by Symfony's AMQP transport: each side consumes what the other
//! sends (delayed messages included), a retry crosses sides with its count, both consume one
//! queue together with none lost or doubled, a message Courier cannot read lands in its failure
//! transport, and both publish the same wire layout.
//!
//! Run with `--include-ignored` after `scripts/services` (PHP, RabbitMQ):
//! `cargo test -p courier-symfony --features amqp,sqlite --test amqp -- --include-ignored`.

#![cfg(all(feature = "amqp", feature = "sqlite"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::scenarios::{
    PHP_LIMIT, assert_courier_got_the_1000, assert_unmapped_and_misfit,
    courier_fails_php_retries_again, courier_moves_unreadable_to, courier_sends, drain,
    failure_reasons, php_and_courier_share_1000, php_consumes_courier_1000,
    php_dispatches_unreadable, php_fails_20_once, php_reads_courier_retries, retry_strategy,
    retry_worker, timeout,
};
use common::{SendEmail, consumed, email, php, registry, serializer};
use courier_core::{DelayStamp, Dsn, Envelope, Transport};
use courier_symfony::AmqpTransport;
use lapin::options::{BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::AMQPValue;
use lapin::{Connection, ConnectionProperties};

/// One test's exchange, queue and delay exchange (unique names), deleted with the delay
/// queues PHP's pattern names when dropped, also when the test fails.
struct Topology {
    /// The broker, `amqp://guest:guest@127.0.0.1:5672/%2f`.
    url: String,
    exchange: String,
    queue: String,
    delays: String,
    failed: String,
}

impl Topology {
    fn new() -> Self {
        let base = courier_test::env::unique_name("courier_symfony");
        Self {
            url: courier_test::env::amqp_url(),
            queue: format!("{base}_q"),
            delays: format!("{base}_delays"),
            failed: format!("{base}_failed"),
            exchange: base,
        }
    }

    /// PHP's DSN for the exchange `exchange` with its queue `queue`.
    fn php_for(&self, exchange: &str, queue: &str) -> String {
        format!(
            "{}/{exchange}?queues[{queue}]&delay[exchange_name]={}",
            self.url, self.delays
        )
    }

    fn php(&self) -> String {
        self.php_for(&self.exchange, &self.queue)
    }

    /// PHP's DSN in consumer mode (`prefetch_count`; PHP reads it and still gets one by one).
    fn php_consuming(&self, prefetch: u16) -> String {
        format!("{}&prefetch_count={prefetch}", self.php())
    }

    /// Courier on `php` (a DSN of this topology), set up.
    async fn courier_on(&self, php: &str) -> Arc<AmqpTransport> {
        let t = self.courier_for("async", php);
        timeout(t.setup()).await.expect("setup");
        t
    }

    fn php_failed(&self) -> String {
        self.php_for(&self.failed, &self.failed)
    }

    fn courier_for(&self, name: &str, php: &str) -> Arc<AmqpTransport> {
        let dsn = Dsn::parse(&format!("symfony+{php}")).expect("dsn");
        Arc::new(AmqpTransport::from_dsn(name, &dsn, serializer(), registry()).expect("transport"))
    }

    async fn courier(&self) -> Arc<AmqpTransport> {
        let t = self.courier_for("async", &self.php());
        timeout(t.setup()).await.expect("setup");
        t
    }

    async fn courier_failed(&self) -> Arc<AmqpTransport> {
        let t = self.courier_for("failed", &self.php_failed());
        timeout(t.setup()).await.expect("setup");
        t
    }

    /// What the test may have created: queues and exchanges.
    fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        // Every delay and retry delay of these tests is a second.
        let queues = vec![
            self.queue.clone(),
            self.failed.clone(),
            format!("delay_{}__1000_delay", self.exchange),
            format!("delay_{}_{}_1000_retry", self.exchange, self.queue),
            format!("delay_{}__1000_delay", self.failed),
        ];
        let exchanges = vec![
            self.exchange.clone(),
            self.failed.clone(),
            self.delays.clone(),
        ];
        (queues, exchanges)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let url = self.url.clone();
        let (queues, exchanges) = self.leftovers();
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let conn = Connection::connect(&url, ConnectionProperties::default())
                    .await
                    .expect("connect for cleanup");
                for q in &queues {
                    // Deleting a queue that is not there is fine with RabbitMQ; a fresh channel
                    // each time all the same.
                    let ch = conn.create_channel().await.expect("channel");
                    let _ = ch
                        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                for e in &exchanges {
                    let ch = conn.create_channel().await.expect("channel");
                    let _ = ch
                        .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "cleanup done".into()).await;
            });
        });
        let _ = cleanup.join();
    }
}

async fn message_count(t: &AmqpTransport) -> u64 {
    let t: &dyn Transport = t;
    let counter = t.as_message_count().expect("counts");
    timeout(counter.message_count()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn php_dispatches_1000_and_courier_consumes_them_all() {
    let topo = Topology::new();
    let t = topo.courier().await;
    courier_consumes_what_php_dispatched(&topo, &t).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn in_consumer_mode_php_dispatches_1000_and_courier_consumes_them_all() {
    let topo = Topology::new();
    let t = topo.courier_on(&topo.php_consuming(64)).await;
    courier_consumes_what_php_dispatched(&topo, &t).await;
}

/// PHP dispatches 1,000 messages (every 10th delayed a second) and Courier, on `t`, receives
/// them all, the delayed ones no sooner than a second later.
async fn courier_consumes_what_php_dispatched(topo: &Topology, t: &AmqpTransport) {
    let start = Instant::now();
    php(
        "dispatch.php",
        &[&topo.php(), "1", "1000", "10"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    let delay_queue = format!("delay_{}__1000_delay", topo.exchange);
    assert!(
        queue_exists(&topo.url, &delay_queue).await,
        "PHP delayed through {delay_queue}"
    );
    // Each received with the time it came: a delayed one comes a second after it was sent at
    // the earliest, so a second after PHP started.
    let mut got = Vec::new();
    while got.len() < 1000 && start.elapsed() < Duration::from_secs(60) {
        let batch = timeout(t.get(100)).await.unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let at = start.elapsed();
        timeout(t.ack_batch(&batch)).await.unwrap();
        got.extend(batch.into_iter().map(|e| (e, at)));
    }
    for (envelope, at) in &got {
        let message = envelope
            .message::<SendEmail>()
            .unwrap_or_else(|| panic!("{:?}", envelope.decode_error()));
        if message.id % 10 == 0 {
            assert!(
                *at >= Duration::from_secs(1),
                "{} delayed a second, came after {at:?}",
                message.id
            );
        }
    }
    assert_courier_got_the_1000(got.iter().map(|(envelope, _)| envelope));
    assert_eq!(message_count(t).await, 0);
}

/// The ids of a batch's messages, in the order they came.
fn ids_of(batch: &[Envelope]) -> Vec<i64> {
    batch
        .iter()
        .map(|e| e.message::<SendEmail>().expect("an email").id)
        .collect()
}

/// A `get` asks for its whole batch at once (the `basic.get`s in flight together) and an
/// `ack_batch` settles its deliveries together: a batch comes in the queue's order, and what
/// was acked is gone while what was not comes back once the connection that held it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn a_batch_comes_in_order_and_only_what_was_acked_is_gone() {
    let topo = Topology::new();
    let t = topo.courier().await;
    let envelopes = (1..=150)
        .map(|id| Envelope::new(email(id, "+00:00")))
        .collect();
    timeout(t.send_batch(envelopes)).await.unwrap();
    let first = timeout(t.get(100)).await.unwrap();
    assert_eq!(ids_of(&first), (1..=100).collect::<Vec<_>>());
    let rest = timeout(t.get(100)).await.unwrap();
    assert_eq!(ids_of(&rest), (101..=150).collect::<Vec<_>>());
    assert!(timeout(t.get(100)).await.unwrap().is_empty());
    timeout(t.ack_batch(&first)).await.unwrap();
    drop(t);
    // The 50 not acked come back to another connection, and nothing else.
    let again = topo.courier().await;
    let back = drain(&*again, 50, Duration::from_secs(20)).await;
    assert_eq!(ids_of(&back), (101..=150).collect::<Vec<_>>());
    assert!(timeout(again.get(100)).await.unwrap().is_empty());
    assert_eq!(message_count(&again).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn courier_dispatches_1000_and_php_consumes_them_all() {
    let topo = Topology::new();
    let t = topo.courier().await;
    courier_sends(&*t, 1, 1000, "+00:00").await;
    php_consumes_courier_1000(&topo.php(), "UTC", "+00:00").await;
    assert_eq!(message_count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn a_retry_crosses_from_php_to_courier_and_back_with_its_count() {
    let topo = Topology::new();
    let t = topo.courier().await;
    // PHP fails each once: Symfony's retry listener sends it again with RedeliveryStamp 1,
    // through its retry delay queue.
    php_fails_20_once(&topo.php()).await;
    let php_retry_queue = format!("delay_{}_{}_1000_retry", topo.exchange, topo.queue);
    assert!(
        queue_exists(&topo.url, &php_retry_queue).await,
        "{php_retry_queue}"
    );

    // Courier fails each again: its worker retries it with RedeliveryStamp 2.
    courier_fails_php_retries_again(t.clone(), "async", retry_strategy().multiplier(1.0)).await;

    let lines = php_reads_courier_retries(&topo.php(), 2).await;
    let ids: BTreeSet<i64> = lines.iter().map(|l| l.id.unwrap()).collect();
    assert_eq!(ids, common::ids(1..=20));
    assert_eq!(message_count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn a_retry_crosses_from_courier_to_php_with_its_count() {
    let topo = Topology::new();
    let t = topo.courier().await;
    courier_retries_for_php(&topo, t, &topo.php()).await;
}

/// In consumer mode, the retries come back into the queue while the transport whose worker
/// stopped is still open: it gives them back to the queue for PHP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn in_consumer_mode_a_retry_crosses_from_courier_to_php_with_its_count() {
    let topo = Topology::new();
    let dsn = topo.php_consuming(64);
    let t = topo.courier_on(&dsn).await;
    courier_retries_for_php(&topo, t, &dsn).await;
}

/// A Courier worker on `t` fails 20 messages once each; PHP, on `php_dsn`, reads them back with
/// the retry count 1.
async fn courier_retries_for_php(topo: &Topology, t: Arc<AmqpTransport>, php_dsn: &str) {
    // None delayed: the worker's 20 are the 20 first deliveries, not a retry among them.
    let envelopes = (1..=20)
        .map(|id| Envelope::new(email(id, "+00:00")))
        .collect();
    timeout(t.send_batch(envelopes)).await.unwrap();
    // Courier fails each once (RedeliveryStamp 1, through PHP's retry delay queue).
    let (counts, stats) =
        retry_worker(t.clone(), "async", retry_strategy().multiplier(1.0), 20).await;
    assert_eq!(stats.retried, 20, "{stats:?}");
    assert_eq!(counts, vec![0; 20]);
    let retry_queue = format!("delay_{}_{}_1000_retry", topo.exchange, topo.queue);
    assert!(
        queue_exists(&topo.url, &retry_queue).await,
        "Courier retried through PHP's retry delay queue {retry_queue}"
    );
    // PHP fails each again (it has count 1 already: fail-new fails only count 0, so run a
    // plain consumer that reads them and check the count).
    php_reads_courier_retries(php_dsn, 1).await;
    assert_eq!(message_count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn php_and_courier_workers_share_one_queue_with_none_lost_or_doubled() {
    let topo = Topology::new();
    let t = topo.courier().await;
    php_and_courier_share_1000(&*t, topo.php(), "15", async |php_finished, elapsed| {
        php_finished || elapsed > Duration::from_secs(12)
    })
    .await;
    assert_eq!(message_count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn in_consumer_mode_php_and_courier_workers_share_one_queue_with_none_lost_or_doubled() {
    let topo = Topology::new();
    let dsn = topo.php_consuming(10);
    let t = topo.courier_on(&dsn).await;
    php_and_courier_share_1000(&*t, dsn, "15", async |php_finished, elapsed| {
        php_finished || elapsed > Duration::from_secs(12)
    })
    .await;
    assert_eq!(message_count(&t).await, 0);
}

/// In consumer mode the broker pushes up to `prefetch_count` messages ahead of the `get`s: a
/// transport that no `get` asks any more (its worker stopped, the application running on)
/// gives back those it did not hand out, within seconds, for another worker to take; the one it
/// handed out stays its own until acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn a_consumer_no_get_asks_gives_back_what_it_did_not_hand_out() {
    let topo = Topology::new();
    let t = topo.courier_on(&topo.php_consuming(10)).await;
    let envelopes = (1..=10)
        .map(|id| Envelope::new(email(id, "+00:00")))
        .collect();
    timeout(t.send_batch(envelopes)).await.unwrap();
    let first = timeout(t.get(1)).await.unwrap();
    assert_eq!(ids_of(&first), vec![1]);
    // The other nine were pushed to the consumer: soon none is ready in the queue, then, with
    // no `get` asking, all nine are again.
    let mut counts = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        let count = message_count(&t).await;
        if counts.last() != Some(&count) {
            counts.push(count);
        }
        if count == 9 && counts.contains(&0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counts.last(), Some(&9), "ready counts: {counts:?}");
    assert!(counts.contains(&0), "pushed ahead first: {counts:?}");
    assert!(
        start.elapsed() >= Duration::from_secs(4),
        "held while a worker may still ask: {:?}",
        start.elapsed()
    );
    // Another worker takes them, in order; the first is still held, then acked.
    let other = topo.courier().await;
    let rest = drain(&*other, 9, Duration::from_secs(10)).await;
    assert_eq!(ids_of(&rest), (2..=10).collect::<Vec<_>>());
    timeout(t.ack_batch(&first)).await.unwrap();
    drop(t);
    assert!(timeout(other.get(10)).await.unwrap().is_empty());
    assert_eq!(message_count(&other).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason() {
    let topo = Topology::new();
    let t = topo.courier().await;
    let failed = topo.courier_failed().await;
    php_dispatches_unreadable(&topo.php()).await;
    courier_moves_unreadable_to(t.clone(), "async", failed.clone(), 2).await;
    assert_eq!(message_count(&t).await, 0, "none left to loop");
    let (_, reasons) = failure_reasons(&*failed, 2).await;
    assert_unmapped_and_misfit(&reasons);
    assert_eq!(message_count(&failed).await, 0);
}

/// The message as it sits in the queue: content type, delivery mode, header names and types.
async fn raw_layout(url: &str, queue: &str) -> (Option<String>, Option<u8>, Vec<(String, char)>) {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let got = timeout(ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }))
        .await
        .expect("basic.get")
        .expect("a message");
    let p = &got.delivery.properties;
    let headers = p
        .headers()
        .as_ref()
        .map(|t| {
            t.inner()
                .iter()
                .map(|(k, v)| {
                    let kind = match v {
                        AMQPValue::LongString(_) => 'S',
                        _ => '?',
                    };
                    (k.as_str().to_owned(), kind)
                })
                .collect()
        })
        .unwrap_or_default();
    let layout = (
        p.content_type().as_ref().map(|c| c.as_str().to_owned()),
        *p.delivery_mode(),
        headers,
    );
    assert!(p.timestamp().is_some(), "a timestamp as PHP sets");
    let _ = conn.close(200, "done".into()).await;
    layout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn courier_publishes_the_layout_php_publishes() {
    let topo = Topology::new();
    let t = topo.courier().await;
    php("dispatch.php", &[&topo.php(), "1", "1"], "UTC", PHP_LIMIT).await;
    let from_php = raw_layout(&topo.url, &topo.queue).await;
    timeout(t.send(Envelope::new(email(1, "+00:00"))))
        .await
        .unwrap();
    let from_courier = raw_layout(&topo.url, &topo.queue).await;
    assert_eq!(from_php.0.as_deref(), Some("application/json"));
    assert_eq!(from_php.1, Some(2), "persistent");
    assert!(
        from_php.2.iter().any(|(k, _)| k == "type"),
        "{:?}",
        from_php.2
    );
    assert_eq!(from_courier, from_php);
}

/// Whether `queue` exists (a passive declare on a channel of its own).
async fn queue_exists(url: &str, queue: &str) -> bool {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    let found = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = conn.close(200, "done".into()).await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn both_sides_declare_the_same_delay_queue_alike() {
    let topo = Topology::new();
    let t = topo.courier().await;
    let delay_queue = format!("delay_{}__1000_delay", topo.exchange);
    let delayed = |id| Envelope::new(email(id, "+00:00")).with(DelayStamp(Duration::from_secs(1)));
    // Courier declares PHP's delay queue, PHP declares it again (RabbitMQ refuses a
    // declaration with other arguments), and Courier once more.
    timeout(t.send(delayed(1))).await.unwrap();
    assert!(queue_exists(&topo.url, &delay_queue).await, "{delay_queue}");
    php(
        "dispatch.php",
        &[&topo.php(), "2", "1", "1"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    t.close().await;
    timeout(t.send(delayed(3))).await.unwrap();
    let early = timeout(t.get(10)).await.unwrap();
    assert!(
        early
            .iter()
            .all(|e| e.message::<SendEmail>().unwrap().id != 3),
        "the one sent just now waits in the delay queue"
    );
    timeout(t.ack_batch(&early)).await.unwrap();
    let got = drain(&*t, 3 - early.len(), Duration::from_secs(10)).await;
    let ids: BTreeSet<i64> = got
        .iter()
        .chain(&early)
        .map(|e| e.message::<SendEmail>().unwrap().id)
        .collect();
    assert_eq!(ids, common::ids(1..=3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and rabbitmq: run scripts/services, set COURIER_TEST_AMQP_URL"]
async fn the_factory_builds_it_from_a_symfony_amqp_dsn_php_shares() {
    use courier_core::{FactoryContext, TransportRegistry};
    use courier_symfony::{SymfonyTransportFactory, SymfonyTypes};

    let topo = Topology::new();
    let factories = TransportRegistry::new().with(Arc::new(SymfonyTransportFactory::new(
        SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send"),
    )));
    let create = |dsn: String| {
        let ctx = FactoryContext::new("async", Dsn::parse(&dsn).unwrap()).registry(registry());
        let factories = &factories;
        async move { timeout(factories.create(ctx)).await }
    };
    let t = create(format!("symfony+{}", topo.php())).await.unwrap();
    assert_eq!(t.messaging_system(), "rabbitmq");
    assert!(
        queue_exists(&topo.url, &topo.queue).await,
        "auto_setup declared the queue"
    );
    t.send(Envelope::new(email(5, "+00:00"))).await.unwrap();
    let out = php("consume.php", &[&topo.php(), "1", "10"], "UTC", PHP_LIMIT).await;
    let lines = consumed(&out);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].id, Some(5));

    // A bad option is named, the password never shown.
    let bad = topo.php().replace("guest:guest@", "guest:s3cr3t@") + "&queue=x";
    let err = create(format!("symfony+{bad}")).await.expect_err("refused");
    let text = courier_core::error_chain(&err).to_string();
    assert!(text.contains("`queue`"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    // A wrong password fails to connect without showing it.
    let wrong = topo.php().replace("guest:guest@", "guest:s3cr3t@");
    let err = create(format!("symfony+{wrong}"))
        .await
        .expect_err("refused");
    let text = courier_core::error_chain(&err).to_string();
    assert!(!text.contains("s3cr3t"), "{text}");
}
