//! NATS-specific behaviour beyond the conformance suite: the duplicate window, the real
//! `ack_wait` redelivery and `keepalive` pushing it out, names and DSNs.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::time::Duration;

use common::{NatsHarness, OP};
use courier_core::{Envelope, MessageIdStamp, RedeliveryStamp, Transport, TransportErrorKind};
use courier_nats::NatsTransport;
use courier_test::TestMessage;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn the_same_envelope_sent_twice_is_stored_once_and_a_retry_of_it_is_new() {
    let h = NatsHarness::new().await;
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_dup")))
        .await;
    let envelope = Envelope::new(TestMessage::new(1)).with(MessageIdStamp::new());
    let first = ok("send", t.send(envelope.clone())).await;
    let again = ok("send again", t.send(envelope.clone())).await;
    assert_eq!(
        first.id(),
        again.id(),
        "the duplicate names the stored message"
    );
    assert_eq!(count(&t).await, 1, "a relay sending twice stores once");
    ok(
        "send a retry",
        t.send(envelope.with(RedeliveryStamp::new(1))),
    )
    .await;
    assert_eq!(count(&t).await, 2, "a retry (new stamps) is a new message");
    let plain = Envelope::new(TestMessage::new(2));
    ok("send", t.send(plain.clone())).await;
    ok("send", t.send(plain)).await;
    assert_eq!(
        count(&t).await,
        4,
        "without a message id nothing is deduplicated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn an_unacked_delivery_comes_back_after_ack_wait_unless_kept_alive() {
    let h = NatsHarness::new().await;
    let ack_wait = Duration::from_secs(1);
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_wait")).ack_wait(ack_wait))
        .await;
    assert_eq!(t.capabilities().redeliver_after, Some(ack_wait));
    let sent = ok("send", t.send(Envelope::new(TestMessage::new(1)))).await;
    let first = ok("get", t.get(1)).await;
    assert_eq!(first.len(), 1);
    // Kept alive every 400 ms for 1.6 s: longer than ack_wait, and still not redelivered.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        ok("keepalive", t.keepalive(&first[0])).await;
    }
    assert!(
        ok("get", t.get(1)).await.is_empty(),
        "a kept-alive delivery was redelivered"
    );
    // Left alone past ack_wait: delivered again, same id.
    tokio::time::sleep(ack_wait + Duration::from_millis(300)).await;
    let again = ok("get", t.get(1)).await;
    assert_eq!(again.len(), 1, "the expired delivery came back");
    assert_eq!(again[0].id(), sent.id());
    ok("late ack of the expired delivery", t.ack(&first[0])).await;
    assert_eq!(count(&t).await, 1, "the late ack deleted nothing");
    ok("ack", t.ack(&again[0])).await;
    assert_eq!(count(&t).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_unreachable_fails_fast_and_transiently() {
    let dsn = courier_core::Dsn::parse("nats://127.0.0.1:1/nowhere?connect_timeout=500ms").unwrap();
    let started = tokio::time::Instant::now();
    let e = NatsTransport::connect("nowhere", &dsn, courier_test::registry())
        .await
        .expect_err("no server on port 1");
    assert!(e.is_transient(), "{e}");
    assert!(matches!(
        e.kind(),
        TransportErrorKind::Connection | TransportErrorKind::Timeout
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn a_worker_handles_every_message_sent_through_nats_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use courier_core::{CancellationToken, HandlerError, MessageBus, Worker};

    let h = NatsHarness::new().await;
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_worker")))
        .await;
    let handled = Arc::new(AtomicU64::new(0));
    let seen = Arc::clone(&handled);
    let bus = MessageBus::builder()
        .transport("nats", t.clone())
        .route("courier.test", ["nats"])
        .message::<TestMessage>()
        .handler_fn("count", move |m: Arc<TestMessage>| {
            let seen = Arc::clone(&seen);
            async move {
                seen.fetch_add(m.seq, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    for seq in 1..=40 {
        ok("dispatch", async {
            bus.dispatch(TestMessage::new(seq)).await.map_err(|e| {
                courier_core::TransportError::new(TransportErrorKind::Other, "bus").with_source(e)
            })
        })
        .await;
    }
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        Worker::builder(bus)
            .receiver("nats", t.clone())
            .limit(40)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("the worker timed out")
    .expect("the worker");
    assert_eq!(stats.handled, 40);
    assert_eq!(handled.load(Ordering::Relaxed), (1..=40).sum::<u64>());
    assert_eq!(count(&t).await, 0, "every message acked");
}

/// Deleting a stream that is gone fails naming it as not found (the test harness's teardown
/// relies on it to tell a lost answer from a stream left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn deleting_a_stream_that_is_gone_says_not_found() {
    let h = NatsHarness::new().await;
    let t = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_gone")))
        .await;
    ok("send", t.send(Envelope::new(TestMessage::new(1)))).await;
    ok("delete", t.delete_stream()).await;
    let e = tokio::time::timeout(OP, t.delete_stream())
        .await
        .expect("an answer")
        .expect_err("the stream is gone");
    assert!(
        courier_core::error_chain(&e)
            .to_string()
            .contains("not found"),
        "{}",
        courier_core::error_chain(&e).to_string()
    );
}
