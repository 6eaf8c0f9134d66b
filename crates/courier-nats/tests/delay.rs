//! Delayed messages never stall a consumer: however many wait for their time, messages sent
//! without a delay are handled at once. Delayed messages wait on a subject and a consumer of
//! their own, outside the pending window of the consumer workers pull from.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{NatsHarness, OP};
use courier_core::{
    CancellationToken, DelayStamp, Envelope, HandlerError, MessageBus, Transport,
    TransportErrorKind, Worker,
};
use courier_nats::NatsTransport;
use courier_test::TestMessage;
use tokio::time::Instant;

/// How long the immediate messages may take behind the delayed ones: a bound that fails the
/// test if they are stuck, not a speed claim.
const BOUND: Duration = Duration::from_secs(30);

async fn ok<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, courier_core::TransportError>>,
) -> T {
    match tokio::time::timeout(OP, fut).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what} timed out"),
    }
}

async fn count(t: &NatsTransport) -> u64 {
    ok(
        "message_count",
        t.abilities().message_count.expect("counts").message_count(),
    )
    .await
}

/// Runs a worker on `t` until it handled `n` messages or `BOUND` passed; returns the seqs it
/// handled.
async fn handle(t: &Arc<NatsTransport>, n: u64) -> Vec<u64> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let bus = MessageBus::builder()
        .transport("nats", t.clone())
        .route("courier.test", ["nats"])
        .message::<TestMessage>()
        .handler_fn("record", move |m: Arc<TestMessage>| {
            let log = Arc::clone(&log);
            async move {
                log.lock().unwrap().push(m.seq);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let stop = CancellationToken::new();
    let run = Worker::builder(bus)
        .receiver("nats", t.clone())
        .limit(n)
        .build()
        .run(stop.clone());
    let outcome = tokio::time::timeout(BOUND, run).await;
    stop.cancel();
    let handled = seen.lock().unwrap().clone();
    match outcome {
        Ok(stats) => {
            let stats = stats.expect("the worker");
            assert_eq!(stats.handled, n, "{stats:?}");
        }
        Err(_) => panic!(
            "the worker handled {} of {n} messages within {BOUND:?}: the consumer is stalled",
            handled.len()
        ),
    }
    handled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn twenty_thousand_messages_delayed_an_hour_do_not_hold_up_immediate_ones() {
    let h = NatsHarness::new().await;
    // The default max_ack_pending (10,000): fewer than the delayed messages.
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique(
            "courier_delay_many",
        )))
        .await;
    let delayed: Vec<Envelope> = (1_000_000..1_020_000)
        .map(|seq| Envelope::new(TestMessage::new(seq)).with(DelayStamp(Duration::from_secs(3600))))
        .collect();
    ok("send the delayed batch", t.send_batch(delayed)).await;
    let immediate: Vec<Envelope> = (1..=100)
        .map(|seq| Envelope::new(TestMessage::new(seq)))
        .collect();
    ok("send the immediate batch", t.send_batch(immediate)).await;

    let mut handled = handle(&t, 100).await;
    handled.sort_unstable();
    assert_eq!(
        handled,
        (1..=100).collect::<Vec<u64>>(),
        "exactly the immediate messages, none of the delayed ones"
    );
    assert_eq!(count(&t).await, 20_000, "the delayed messages all wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn more_delayed_messages_than_max_delayed_all_arrive_in_time_and_none_early() {
    let h = NatsHarness::new().await;
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_delay_bound")).max_delayed(5))
        .await;
    let delay = Duration::from_secs(1);
    let sent = Instant::now();
    let delayed: Vec<Envelope> = (1..=20)
        .map(|seq| Envelope::new(TestMessage::new(seq)).with(DelayStamp(delay)))
        .collect();
    ok("send the delayed batch", t.send_batch(delayed)).await;
    let mut seen = BTreeSet::new();
    while seen.len() < 20 {
        assert!(
            sent.elapsed() < BOUND,
            "only {} of 20 delayed messages arrived within {BOUND:?}",
            seen.len()
        );
        let got = ok("get", t.get(10)).await;
        if !got.is_empty() {
            let elapsed = sent.elapsed();
            assert!(
                elapsed + Duration::from_millis(10) >= delay,
                "a message delayed {delay:?} came after {elapsed:?}"
            );
        }
        for envelope in &got {
            let m = envelope.message::<TestMessage>().expect("a test message");
            assert!(seen.insert(m.seq), "message {} came twice", m.seq);
        }
        ok("ack", t.ack_batch(&got)).await;
    }
    assert_eq!(count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn delayed_messages_published_on_the_main_subject_are_moved_out_of_the_way() {
    // A producer that publishes delayed messages on the consumed subject with the delay header
    // (another language, or a Courier before delayed messages had a subject of their own).
    let h = NatsHarness::new().await;
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_delay_moved")).max_ack_pending(40))
        .await;
    let subject = t.options().subject_name().to_owned();
    let client = h.raw_client().await;
    let js = async_nats::jetstream::new(client);
    let mut acks = Vec::new();
    for seq in 0..50u64 {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("type", "courier.test");
        headers.insert("content-type", "application/json");
        headers.insert("Courier-Delay", "3600000");
        let body = serde_json::json!({"seq": 1_000 + seq, "text": "later"}).to_string();
        acks.push(
            js.publish_with_headers(subject.clone(), headers, body.into())
                .await
                .expect("raw publish"),
        );
    }
    for ack in acks {
        tokio::time::timeout(OP, ack.into_future())
            .await
            .expect("PubAck timed out")
            .expect("PubAck");
    }
    let immediate: Vec<Envelope> = (1..=10)
        .map(|seq| Envelope::new(TestMessage::new(seq)))
        .collect();
    ok("send the immediate batch", t.send_batch(immediate)).await;

    let mut handled = handle(&t, 10).await;
    handled.sort_unstable();
    assert_eq!(handled, (1..=10).collect::<Vec<u64>>());
    assert_eq!(count(&t).await, 50, "the delayed messages all wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn a_delayed_send_without_the_delay_subject_in_the_stream_names_it() {
    // auto_setup off on a stream set up by hand with the main subject only.
    let h = NatsHarness::new().await;
    let stream = NatsHarness::unique("courier_delay_nosub");
    let made = h.make(NatsHarness::options(&stream)).await;
    let js = async_nats::jetstream::new(h.raw_client().await);
    let mut config = js
        .get_stream(&stream)
        .await
        .expect("the stream")
        .cached_info()
        .config
        .clone();
    config.subjects = vec![made.options().subject_name().to_owned()];
    js.update_stream(&config).await.expect("narrow the stream");
    let t = NatsTransport::new(
        stream.clone(),
        &h.proxied_dsn(),
        NatsHarness::options(&stream).auto_setup(false),
        courier_test::registry(),
    )
    .expect("transport");
    let e = tokio::time::timeout(
        OP,
        t.send(Envelope::new(TestMessage::new(1)).with(DelayStamp(Duration::from_secs(5)))),
    )
    .await
    .expect("send timed out")
    .expect_err("no stream captures the delay subject");
    assert_eq!(e.kind(), TransportErrorKind::NotFound, "{e}");
    let shown = format!("{e}");
    assert!(
        shown.contains(&made.options().delay_subject_name()),
        "the error names the delay subject: {shown}"
    );
    t.close().await;
}
