//! Redis-specific behaviour beyond the conformance suite: many consumers, dead consumers,
//! delayed messages at scale, keepalive, group loss, own-pending recovery and the factory.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::RedisHarness;
use courier_core::{
    DelayStamp, Dsn, Envelope, FactoryContext, Transport, TransportErrorKind, TransportRegistry,
};
use courier_redis::{RedisOptions, RedisTransport, RedisTransportFactory};
use courier_test::TestMessage;
use tokio::time::{Instant, timeout};

const IGNORE: &str = "needs redis: set COURIER_TEST_REDIS_URL";
/// Bound on any single transport call in these tests.
const OP: Duration = Duration::from_secs(10);

async fn op<T, E: std::fmt::Debug>(what: &str, fut: impl Future<Output = Result<T, E>>) -> T {
    match timeout(OP, fut).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what} failed: {e:?}"),
        Err(_) => panic!("{what} timed out"),
    }
}

fn message(seq: u64) -> Envelope {
    Envelope::new(TestMessage::new(seq))
}

fn seq(e: &Envelope) -> u64 {
    e.message::<TestMessage>()
        .expect("a decoded test message")
        .seq
}

async fn count(t: &RedisTransport) -> u64 {
    op(
        "message_count",
        t.abilities().message_count.unwrap().message_count(),
    )
    .await
}

fn stream() -> String {
    courier_test::env::unique_name("courier_test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn four_consumers_handle_twenty_thousand_messages_exactly_once() {
    let _ = IGNORE;
    const TOTAL: u64 = 20_000;
    let h = RedisHarness::new();
    let name = stream();
    let producer = h.with_options(h.options(&name)).await;
    op("setup", producer.abilities().setup.unwrap().setup()).await;
    let mut consumers = Vec::new();
    for _ in 0..4 {
        consumers.push(h.with_options(h.options(&name)).await);
    }
    let seen: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, c) in consumers.iter().enumerate() {
        let (c, seen) = (c.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut handled = 0usize;
            while Instant::now() < deadline {
                let got = op("get", c.get(64)).await;
                if got.is_empty() {
                    if seen.lock().unwrap().len() as u64 >= TOTAL {
                        break;
                    }
                    continue;
                }
                {
                    let mut seen = seen.lock().unwrap();
                    for e in &got {
                        *seen.entry(seq(e)).or_default() += 1;
                    }
                }
                handled += got.len();
                op("ack_batch", c.ack_batch(&got)).await;
            }
            (i, handled)
        }));
    }
    for chunk in (0..TOTAL).collect::<Vec<_>>().chunks(500) {
        op(
            "send_batch",
            producer.send_batch(chunk.iter().map(|s| message(*s)).collect()),
        )
        .await;
    }
    let mut per_consumer = Vec::new();
    for task in tasks {
        per_consumer.push(
            timeout(Duration::from_secs(150), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let seen = seen.lock().unwrap().clone();
    let twice: Vec<_> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(s, _)| *s)
        .collect();
    assert!(
        twice.is_empty(),
        "handled more than once while live: {:?}",
        &twice[..twice.len().min(10)]
    );
    assert_eq!(seen.len() as u64, TOTAL, "every message handled");
    assert!(
        per_consumer.iter().filter(|(_, n)| *n > 0).count() >= 2,
        "work was shared: {per_consumer:?}"
    );
    assert_eq!(count(&producer).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn dead_consumers_pending_entries_are_claimed_after_redeliver_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    let h = RedisHarness::new();
    let name = stream();
    let options = || h.options(&name).redeliver_timeout(TIMEOUT);
    let dying = h.with_options(options()).await;
    op("setup", dying.abilities().setup.unwrap().setup()).await;
    op(
        "send_batch",
        dying.send_batch((0..50).map(message).collect()),
    )
    .await;
    // Taken before the read: Redis counts a delivery's idle time from when it handed it out
    // (in whole milliseconds), which is before the read returns.
    let received_at = Instant::now();
    let batch = op("get", dying.get(20)).await;
    assert_eq!(batch.len(), 20);
    op("ack of one", dying.ack(&batch[0])).await;
    // The consumer dies mid-batch: its connections go away, 19 deliveries stay pending.
    assert!(h.kill_connections(dying.consumer()).await > 0);

    let survivor = h.with_options(options()).await;
    let mut claimed: Vec<Envelope> = Vec::new();
    let mut seqs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seqs.len() < 49 && Instant::now() < deadline {
        let batch = op("get", survivor.get(64)).await;
        for e in batch {
            seqs.push(seq(&e));
            if (1..20).contains(&seq(&e)) {
                assert!(
                    received_at.elapsed() + Duration::from_millis(2) >= TIMEOUT,
                    "seq {} claimed before redeliver_timeout",
                    seq(&e)
                );
                claimed.push(e);
            } else {
                op("ack", survivor.ack(&e)).await;
            }
        }
    }
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..50).collect::<Vec<_>>(),
        "the survivor got the dead consumer's pending entries and the rest, each once"
    );

    // The dead consumer's late acks are no-ops: the survivor's deliveries stay.
    op("late ack_batch", dying.ack_batch(&batch[1..])).await;
    assert_eq!(count(&survivor).await, 19);
    op("ack_batch", survivor.ack_batch(&claimed)).await;
    assert_eq!(count(&survivor).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_thousand_random_delays_are_never_early_and_all_delivered() {
    const N: u64 = 1000;
    let h = RedisHarness::new();
    let name = stream();
    let t = h.with_options(h.options(&name)).await;
    op("setup", t.abilities().setup.unwrap().setup()).await;
    let mut due: HashMap<u64, Instant> = HashMap::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
        let start = Instant::now();
        let batch: Vec<Envelope> = chunk
            .iter()
            .map(|s| {
                let delay = Duration::from_millis(fastrand::u64(0..=2000));
                due.insert(*s, start + delay);
                message(*s).with(DelayStamp(delay))
            })
            .collect();
        op("send_batch", t.send_batch(batch)).await;
    }
    let mut seen = HashSet::new();
    let mut latest = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(15);
    while (seen.len() as u64) < N && Instant::now() < deadline {
        let got = op("get", t.get(64)).await;
        let now = Instant::now();
        for e in &got {
            let s = seq(e);
            // Server (wall) clock vs this process's monotonic clock: allow 1 ms.
            assert!(
                now + Duration::from_millis(1) >= due[&s],
                "seq {s} delivered {:?} early",
                due[&s] - now
            );
            latest = latest.max(now.saturating_duration_since(due[&s]));
            assert!(seen.insert(s), "seq {s} delivered twice");
        }
        op("ack_batch", t.ack_batch(&got)).await;
    }
    assert_eq!(seen.len() as u64, N, "every delayed message delivered");
    let mut conn = h.conn().await;
    let [_, zset, data] = t.keys();
    let (zcard, hlen): (u64, u64) = redis::pipe()
        .cmd("ZCARD")
        .arg(zset)
        .cmd("HLEN")
        .arg(data)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((zcard, hlen), (0, 0), "the delayed set is empty at the end");
    assert_eq!(count(&t).await, 0);
    assert!(
        latest < Duration::from_millis(1500),
        "latest delivery {latest:?} after due"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn keepalive_holds_a_delivery_past_redeliver_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    let h = RedisHarness::new();
    let name = stream();
    let holder = h
        .with_options(h.options(&name).redeliver_timeout(TIMEOUT))
        .await;
    let other = h
        .with_options(h.options(&name).redeliver_timeout(TIMEOUT))
        .await;
    op("setup", holder.abilities().setup.unwrap().setup()).await;
    op("send", holder.send(message(7))).await;
    let got = op("get", holder.get(1)).await;
    assert_eq!(got.len(), 1);
    let until = Instant::now() + TIMEOUT * 3;
    while Instant::now() < until {
        op("keepalive", holder.keepalive(&got[0])).await;
        assert!(
            op("get (other)", other.get(1)).await.is_empty(),
            "a kept-alive delivery was claimed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Without keepalive it is claimed once idle for longer than the timeout.
    let mut claimed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while claimed.is_empty() && Instant::now() < deadline {
        claimed = op("get (other)", other.get(1)).await;
    }
    assert_eq!(claimed.iter().map(seq).collect::<Vec<_>>(), vec![7]);
    // The holder's delivery is superseded: its keepalive and ack change nothing.
    op("late keepalive", holder.keepalive(&got[0])).await;
    op("late ack", holder.ack(&got[0])).await;
    assert_eq!(count(&other).await, 1);
    op("ack", other.ack(&claimed[0])).await;
    assert_eq!(count(&other).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_deleted_group_is_recreated_and_consuming_goes_on() {
    let h = RedisHarness::new();
    let name = stream();
    let t = h.with_options(h.options(&name)).await;
    op("setup", t.abilities().setup.unwrap().setup()).await;
    op("send", t.send(message(1))).await;
    let got = op("get", t.get(1)).await;
    op("ack", t.ack(&got[0])).await;
    let mut conn = h.conn().await;
    let _: u64 = redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(&name)
        .arg("courier")
        .query_async(&mut conn)
        .await
        .unwrap();
    op("send after the group vanished", t.send(message(2))).await;
    let got = op("get after the group vanished", t.get(1)).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![2]);
    op("ack", t.ack(&got[0])).await;
    // The whole stream deleted (evicted): sending and receiving still work.
    let _: u64 = redis::cmd("DEL")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    op("send after the stream vanished", t.send(message(3))).await;
    let got = op("get after the stream vanished", t.get(1)).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![3]);
    op("ack", t.ack(&got[0])).await;
    assert_eq!(count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_restarted_consumer_takes_back_its_own_pending_entries_at_once() {
    let h = RedisHarness::new();
    let name = stream();
    let consumer = format!("fixed-{}", fastrand::u32(..));
    let first = h
        .with_options(h.options(&name).consumer(consumer.clone()))
        .await;
    op("setup", first.abilities().setup.unwrap().setup()).await;
    op(
        "send_batch",
        first.send_batch((0..3).map(message).collect()),
    )
    .await;
    assert_eq!(op("get", first.get(10)).await.len(), 3);
    drop(first); // "restart": the harness still holds it, but the new one must not wait an hour
    let second = h.with_options(h.options(&name).consumer(consumer)).await;
    let got = op("get", second.get(10)).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![0, 1, 2]);
    op("ack_batch", second.ack_batch(&got)).await;
    assert_eq!(count(&second).await, 0);
}

/// A `get` dropped while its `XREADGROUP BLOCK` waits on the server (a stopped worker's fetch,
/// cut off at shutdown) leaves that read blocked there: an entry sent next is delivered to it,
/// pending for this consumer with nobody holding it. The next `get` takes it back at once, not
/// after the redelivery window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn an_entry_delivered_to_a_dropped_blocking_read_is_taken_back_by_the_next_get() {
    let h = RedisHarness::new();
    let name = stream();
    // The harness's redelivery window is an hour: only the take-back can bring the entry back.
    let options = h.options(&name).poll_window(Duration::from_millis(1500));
    let t = h.with_options(options).await;
    op("setup", t.abilities().setup.unwrap().setup()).await;
    // Nothing to read: the get blocks on the server; drop it there.
    let blocked = tokio::spawn({
        let t = t.clone();
        async move { t.get(10).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    blocked.abort();
    assert!(blocked.await.unwrap_err().is_cancelled());
    op("send", t.send(message(7))).await;
    let started = Instant::now();
    let got = op("get", t.get(10)).await;
    assert_eq!(
        got.iter().map(seq).collect::<Vec<_>>(),
        vec![7],
        "the entry the dropped read took"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "taken back after {:?}, not at once",
        started.elapsed()
    );
    op("ack_batch", t.ack_batch(&got)).await;
    assert_eq!(count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn factory_builds_from_a_dsn_with_options() {
    let url = courier_test::env::redis_url();
    let name = stream();
    let registry = TransportRegistry::new().with(Arc::new(RedisTransportFactory));
    let dsn = Dsn::parse(&format!(
        "{url}?stream={name}&delete_after_ack=false&poll_window=100ms"
    ))
    .unwrap();
    let t = op(
        "create",
        registry.create(FactoryContext::new("events", dsn)),
    )
    .await;
    op("setup", t.as_setup().unwrap().setup()).await;
    op("send", t.send(message(1))).await;
    let got = op("get", t.get(1)).await;
    op("ack", t.ack(&got[0])).await;
    // Without delete_after_ack the entry stays in the stream but is no longer counted.
    assert_eq!(
        op("count", t.as_message_count().unwrap().message_count()).await,
        0
    );
    let mut conn = RedisHarness::new().conn().await;
    let len: u64 = redis::cmd("XLEN")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, 1);
    let _: u64 = redis::cmd("DEL")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn factory_refuses_unknown_options_and_tls_without_the_feature() {
    let registry = TransportRegistry::new().with(Arc::new(RedisTransportFactory));
    let dsn = Dsn::parse("redis://127.0.0.1:1?streem=x").unwrap();
    let err = registry
        .create(FactoryContext::new("q", dsn))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config);
    assert!(err.to_string().contains("unknown option `streem`"), "{err}");
    if !cfg!(feature = "tls") {
        let dsn = Dsn::parse("rediss://:secret@127.0.0.1:1").unwrap();
        let err = registry
            .create(FactoryContext::new("q", dsn))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("tls"), "{err}");
        assert!(
            !err.to_string().contains("secret"),
            "the password leaked: {err}"
        );
    }
}

#[tokio::test]
async fn options_default_to_a_unique_consumer() {
    assert_ne!(
        RedisOptions::default().consumer,
        RedisOptions::default().consumer
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn an_entry_with_malformed_headers_is_named_and_keeps_its_body() {
    let h = RedisHarness::new();
    let name = stream();
    let t = h.with_options(h.options(&name)).await;
    op("setup", t.abilities().setup.unwrap().setup()).await;
    op("send", t.send(message(1))).await;
    let mut conn = h.conn().await;
    let _: String = redis::cmd("XADD")
        .arg(&name)
        .arg("*")
        .arg("body")
        .arg("{\"seq\":2}")
        .arg("headers")
        .arg("not json")
        .query_async(&mut conn)
        .await
        .unwrap();
    let got = op("get", t.get(10)).await;
    assert_eq!(got.len(), 2, "both entries are read in one batch");
    assert_eq!(seq(&got[0]), 1, "the good entry decodes");
    assert!(
        matches!(
            got[1].decode_error(),
            Some(courier_core::DecodeError::InvalidHeaders { .. })
        ),
        "{:?}",
        got[1].decode_error()
    );
    let wire = courier_core::encode(&got[1]).unwrap();
    assert_eq!(
        wire.body, "{\"seq\":2}",
        "the body is kept for the failure transport"
    );
    op("ack_batch", t.ack_batch(&got)).await;
    assert_eq!(count(&t).await, 0);
}
