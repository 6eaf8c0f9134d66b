//! RabbitMQ-specific behaviour beyond the conformance suite: delays on classic and quorum
//! queues at scale, retries routed to the failing queue only, fail-fast sends during an outage,
//! the factory, and a throughput figure.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::{AmqpHarness, OP};
use courier_amqp::{AmqpOptions, AmqpTransport, AmqpTransportFactory, QueueOptions};
use courier_core::{
    DelayStamp, Dsn, Envelope, FactoryContext, Transport, TransportErrorKind, TransportRegistry,
};
use courier_test::TestMessage;
use tokio::time::{Instant, timeout};

async fn op<T, E: std::fmt::Debug>(what: &str, fut: impl Future<Output = Result<T, E>>) -> T {
    match timeout(OP, fut).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what} failed: {e:?}"),
        Err(_) => panic!("{what} timed out"),
    }
}

/// Gets until `n` envelopes came (a `get` returns what was pushed so far) or 5 s passed.
async fn recv(t: &dyn Transport, n: usize) -> Vec<Envelope> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n && Instant::now() < deadline {
        got.extend(op("get", t.get(n - got.len())).await);
    }
    got
}

fn message(seq: u64) -> Envelope {
    Envelope::new(TestMessage::new(seq))
}

fn seq(e: &Envelope) -> u64 {
    e.message::<TestMessage>()
        .expect("a decoded test message")
        .seq
}

/// Sends 1,000 messages with delays 0..=2 s (in steps of 250 ms) in batches of 50, receives
/// them all and checks none came before its delay (measured from the start of its batch) and
/// none is missing or doubled.
async fn thousand_mixed_delays(t: &dyn Transport) {
    const N: u64 = 1000;
    let delay_of = |s: u64| Duration::from_millis((s * 7 % 9) * 250);
    let mut sent_at = BTreeMap::new();
    for chunk in (0..N).collect::<Vec<_>>().chunks(50) {
        let start = Instant::now();
        let batch = chunk
            .iter()
            .map(|&s| message(s).with(DelayStamp(delay_of(s))))
            .collect();
        op("send_batch", t.send_batch(batch)).await;
        for &s in chunk {
            sent_at.insert(s, start);
        }
    }
    let mut seen = BTreeSet::new();
    let mut ids: BTreeMap<u64, (String, String)> = BTreeMap::new();
    let mut early = Vec::new();
    let mut late_ms = 0u128;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < N as usize && Instant::now() < deadline {
        let got = op("get", t.get(64)).await;
        let now = Instant::now();
        for e in &got {
            let s = seq(e);
            let elapsed = now - sent_at[&s];
            if elapsed + Duration::from_millis(5) < delay_of(s) {
                early.push((s, delay_of(s), elapsed));
            }
            late_ms = late_ms.max(elapsed.saturating_sub(delay_of(s)).as_millis());
            let tag = e
                .last::<courier_core::DeliveryTagStamp>()
                .map(|t| t.0.clone())
                .unwrap_or_default();
            let this = (e.id().unwrap_or_default().to_owned(), tag);
            assert!(
                seen.insert(s),
                "message {s} delivered twice: {:?} then {this:?}",
                ids.get(&s)
            );
            ids.insert(s, this);
        }
        op("ack_batch", t.ack_batch(&got)).await;
    }
    assert!(
        early.is_empty(),
        "delivered before their delay: {:?}",
        &early[..early.len().min(10)]
    );
    let missing: Vec<u64> = (0..N).filter(|s| !seen.contains(s)).collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    eprintln!("1000 mixed delays: none early, none lost, worst lateness {late_ms} ms");
    let count = op(
        "message_count",
        t.as_message_count().unwrap().message_count(),
    )
    .await;
    assert_eq!(count, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn delays_are_honoured_on_a_classic_queue_none_early_none_lost() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_classic");
    let t = h.make(AmqpOptions::new(&name)).await;
    thousand_mixed_delays(t.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn delays_are_honoured_on_a_quorum_queue_none_early_none_lost() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_quorum");
    let t = h
        .make(AmqpOptions::new(&name).queues([QueueOptions::new(&name).quorum()]))
        .await;
    thousand_mixed_delays(t.as_ref()).await;
}

/// Two queues (`a` quorum, `b` classic) bound to one fanout exchange; a consumer of `a` retries its message (at once and
/// delayed): the retry reaches `a` only, `b` keeps its single copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn a_retry_reaches_only_the_queue_that_failed() {
    let h = AmqpHarness::new();
    let ex = AmqpHarness::unique("courier_amqp_fan");
    let (qa, qb) = (format!("{ex}_a"), format!("{ex}_b"));
    let both =
        AmqpOptions::new(&ex).queues([QueueOptions::new(&qa).quorum(), QueueOptions::new(&qb)]);
    let producer = h.make(both.clone()).await;
    let a = h
        .make(
            both.clone()
                .queues([QueueOptions::new(&qa).quorum()])
                .poll_window(Duration::from_millis(300)),
        )
        .await;
    let b = h
        .make(
            both.queues([QueueOptions::new(&qb)])
                .poll_window(Duration::from_millis(300)),
        )
        .await;

    op("send", producer.send(message(1))).await;
    op("send", producer.send(message(2))).await;
    let got_a = recv(a.as_ref(), 2).await;
    assert_eq!(got_a.iter().map(seq).collect::<Vec<_>>(), vec![1, 2]);
    op("retry now", a.retry(got_a[0].clone(), Duration::ZERO)).await;
    op(
        "retry delayed",
        a.retry(got_a[1].clone(), Duration::from_millis(300)),
    )
    .await;

    let again = recv(a.as_ref(), 2).await;
    let mut seqs: Vec<u64> = again.iter().map(seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, vec![1, 2], "both retries come back to `a`");
    op("ack a", a.ack_batch(&again)).await;

    let got_b = recv(b.as_ref(), 2).await;
    assert_eq!(
        got_b.iter().map(seq).collect::<Vec<_>>(),
        vec![1, 2],
        "b has its originals"
    );
    op("ack b", b.ack_batch(&got_b)).await;
    tokio::time::sleep(Duration::from_millis(400)).await; // past the retry delay bucket
    let extra = op("get b", b.get(10)).await;
    assert!(
        extra.is_empty(),
        "a retry from `a` leaked into `b`: {:?}",
        extra.iter().map(seq).collect::<Vec<_>>()
    );
    assert!(op("get a", a.get(10)).await.is_empty());
}

/// While the broker is unreachable a send fails quickly with a transient error instead of
/// hanging, and the next attempts fail at once during the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_fail_fast_with_a_transient_error_while_the_broker_is_unreachable() {
    let options = AmqpOptions::new("down").connect_timeout(Duration::from_secs(2));
    let t = AmqpTransport::new(
        "down",
        "amqp://guest:guest@127.0.0.1:1/%2f",
        options,
        courier_test::registry(),
    );
    let start = Instant::now();
    let err = timeout(Duration::from_secs(5), t.send(message(1)))
        .await
        .expect("send must not hang")
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    let start = Instant::now();
    let again = timeout(Duration::from_secs(5), t.send(message(2)))
        .await
        .expect("no hang")
        .unwrap_err();
    assert_eq!(again.kind(), TransportErrorKind::Connection);
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "a send during backoff must fail at once"
    );
    let got = timeout(Duration::from_secs(5), t.get(1))
        .await
        .expect("get must not hang");
    assert!(got.is_err_and(|e| e.is_transient()));
}

#[tokio::test]
async fn the_factory_handles_amqp_schemes_and_names_bad_options() {
    let registry = TransportRegistry::new().with(Arc::new(AmqpTransportFactory));
    assert!(registry.schemes().any(|s| s == "amqp"));
    assert!(registry.schemes().any(|s| s == "amqps"));
    let ctx = FactoryContext::new("x", Dsn::parse("amqp://localhost?colour=red").unwrap());
    let err = registry.create(ctx).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config);
    assert!(err.to_string().contains("unknown option `colour`"), "{err}");
    let ctx = FactoryContext::new(
        "x",
        Dsn::parse("amqp://u:hunter2@localhost?prefetch=none").unwrap(),
    );
    let err = registry.create(ctx).await.unwrap_err().to_string();
    assert!(
        err.contains("prefetch") && !err.contains("hunter2"),
        "{err}"
    );
    let t = registry
        .create(FactoryContext::new(
            "x",
            Dsn::parse("amqp://localhost").unwrap(),
        ))
        .await
        .unwrap();
    assert!(t.as_listable().is_none(), "AMQP queues are not listable");
    assert!(t.capabilities().delay && t.capabilities().redelivery && !t.capabilities().priority);
}

/// A transport built from a DSN (quorum queue with two binding keys on a direct exchange)
/// sets up, sends, receives and acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn a_dsn_configured_quorum_transport_round_trips() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_dsn");
    let dsn = format!(
        "{}?exchange={name}&exchange_type=direct&routing_key=k2&queues[{name}]=k1,k2\
         &queue_arguments[{name}][x-queue-type]=quorum&prefetch=8&poll_window=200ms",
        h.url
    );
    let options = AmqpOptions::from_dsn(&name, &Dsn::parse(&dsn).unwrap()).unwrap();
    let t = h.make(options).await;
    op("send", t.send(message(7))).await;
    let got = op("get", t.get(5)).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![7]);
    op("ack", t.ack(&got[0])).await;
    assert_eq!(
        op(
            "count",
            t.abilities().message_count.unwrap().message_count()
        )
        .await,
        0
    );
}

/// Without `auto_setup` a send to a missing exchange fails (the broker closes the publishing
/// channel); after `setup` the same transport sends again (the channel is reopened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn a_refused_publish_reopens_the_publishing_channel() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_nosetup");
    let t = Arc::new(AmqpTransport::new(
        name.clone(),
        h.url.clone(),
        AmqpOptions::new(&name).auto_setup(false),
        courier_test::registry(),
    ));
    let err = timeout(OP, t.send(message(1)))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(!err.to_string().is_empty());
    op("setup", t.abilities().setup.unwrap().setup()).await;
    op("send after setup", t.send(message(2))).await;
    let got = op("get", t.get(5)).await;
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![2]);
    op("ack", t.ack(&got[0])).await;
    op("teardown", t.delete_topology()).await;
}

/// An unroutable message (a direct exchange with no queue bound for the key) is an error, not
/// a silent loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn an_unroutable_message_is_an_error_not_a_loss() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_unroutable");
    let t = h
        .make(
            AmqpOptions::new(&name)
                .exchange(&name, courier_amqp::ExchangeType::Direct)
                .queues([QueueOptions::new(&name).binding_key("bound")])
                .routing_key("nobody"),
        )
        .await;
    let err = timeout(OP, t.send(message(1)))
        .await
        .expect("no hang")
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::NotFound, "{err}");
    assert!(err.to_string().contains("unroutable"), "{err}");
}

/// The broker closes the transport's connection while a delivery is unacked: the stale ack
/// is harmless, the consumer resumes on a new connection and gets the message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn after_a_broker_side_close_the_consumer_resumes_and_unacked_comes_back() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_kill");
    let t = h.make(AmqpHarness::options(&name)).await;
    op("send", t.send(message(1))).await;
    let first = op("get", t.get(5)).await;
    assert_eq!(first.iter().map(seq).collect::<Vec<_>>(), vec![1]);
    let n = tokio::task::spawn_blocking({
        let name = name.clone();
        move || AmqpHarness::kill_connections(&name)
    })
    .await
    .unwrap();
    assert!(n > 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The stale ack settles nothing (the broker already requeued the delivery).
    let _ = timeout(OP, t.ack(&first[0])).await.expect("no hang");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = Vec::new();
    while again.is_empty() && Instant::now() < deadline {
        match timeout(OP, t.get(5)).await.expect("no hang") {
            Ok(got) => again = got,
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
    }
    assert_eq!(
        again.iter().map(seq).collect::<Vec<_>>(),
        vec![1],
        "the unacked message comes back"
    );
    assert_ne!(
        again[0].last::<courier_core::DeliveryTagStamp>(),
        first[0].last::<courier_core::DeliveryTagStamp>()
    );
    op("ack", t.ack(&again[0])).await;
    assert_eq!(
        op(
            "count",
            t.abilities().message_count.unwrap().message_count()
        )
        .await,
        0
    );
}

/// `ack_batch` of a non-contiguous set acks exactly that set: the gaps (and deliveries pushed
/// but not yet handed out) stay unacked and come back after the consumer dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn ack_batch_with_gaps_acks_exactly_the_given_deliveries() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_gaps");
    let t = h.make(AmqpHarness::options(&name)).await;
    op("send_batch", t.send_batch((0..20).map(message).collect())).await;
    let got = recv(t.as_ref(), 10).await;
    assert_eq!(
        got.iter().map(seq).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let picked: Vec<Envelope> = got
        .iter()
        .filter(|e| ![3, 7].contains(&seq(e)))
        .cloned()
        .collect();
    op("ack_batch with gaps", t.ack_batch(&picked)).await;
    assert_eq!(
        op(
            "count",
            t.abilities().message_count.unwrap().message_count()
        )
        .await,
        12
    );
    t.close_consumer().await;
    let rest = recv(t.as_ref(), 12).await;
    let mut seqs: Vec<u64> = rest.iter().map(seq).collect();
    seqs.sort_unstable();
    let mut expected = vec![3, 7];
    expected.extend(10..20);
    assert_eq!(seqs, expected);
    op("ack_batch", t.ack_batch(&rest)).await;
    assert_eq!(
        op(
            "count",
            t.abilities().message_count.unwrap().message_count()
        )
        .await,
        0
    );
}

/// The queue is deleted under a running consumer (the broker cancels it): with `auto_setup`
/// the next `get` re-declares the topology and consumes again; new messages flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn a_consumer_cancelled_by_the_broker_redeclares_and_resumes() {
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_cancel");
    let t = h.make(AmqpHarness::options(&name)).await;
    assert!(op("get (opens the consumer)", t.get(1)).await.is_empty());
    let conn = lapin::Connection::connect(&h.url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        name.as_str().into(),
        lapin::options::QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "done".into()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        // The send may fail while the queue is gone (unroutable); retry until it is back.
        if timeout(OP, t.send(message(5)))
            .await
            .expect("no hang")
            .is_err()
        {
            let _ = timeout(OP, t.get(1)).await.expect("no hang");
            continue;
        }
        got = recv(t.as_ref(), 1).await;
    }
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), vec![5]);
    op("ack", t.ack(&got[0])).await;
}

/// `consume --queues`: a view of one queue of a two-queue transport receives from that queue
/// only; the other queue keeps its copy, and an unknown queue is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn a_queue_view_consumes_that_queue_only() {
    let h = AmqpHarness::new();
    let ex = AmqpHarness::unique("courier_amqp_view");
    let (qa, qb) = (format!("{ex}_a"), format!("{ex}_b"));
    let both = AmqpOptions::new(&ex)
        .queues([QueueOptions::new(&qa), QueueOptions::new(&qb)])
        .poll_window(Duration::from_millis(300));
    let t = h.make(both).await;
    op("send", t.send(message(7))).await;
    let queues = t.abilities().queues.expect("AMQP has queues");
    let a = op("queue a", queues.queue(&qa)).await;
    let got = recv(a.as_ref(), 1).await;
    assert_eq!(seq(&got[0]), 7);
    op("ack", a.ack(&got[0])).await;
    assert!(op("get a", a.get(10)).await.is_empty(), "a is drained");
    let b = op("queue b", queues.queue(&qb)).await;
    let got = recv(b.as_ref(), 1).await;
    assert_eq!(seq(&got[0]), 7, "b kept its copy");
    op("ack", b.ack(&got[0])).await;
    let err = queues.queue("nope").await.expect_err("unknown queue");
    assert!(err.to_string().contains("no queue `nope`"), "{err}");
}
