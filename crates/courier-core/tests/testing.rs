//! `courier_core::testing`: typed assertions on what was dispatched to an in-memory transport
//! (each failing with a message that says what was expected and lists what was dispatched), and
//! `run_until_empty` on tokio's paused clock (delays and retries without real waiting).
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use courier_core::testing::{run_until_empty, run_until_empty_within};
use courier_core::{
    DelayStamp, Envelope, HandlerError, InMemoryTransport, MessageBus, PriorityStamp,
    SentToFailureTransportStamp, SyncTransport, Worker, WorkerError,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    id: u64,
}
impl courier_core::Message for Invoice {
    const NAME: &'static str = "test.invoice";
}

#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    to: String,
}
impl courier_core::Message for Mail {
    const NAME: &'static str = "test.mail";
}

/// A bus routing everything to `queue`, with no handler (dispatch only).
fn producer(queue: &Arc<InMemoryTransport>) -> MessageBus {
    MessageBus::builder()
        .transport("async", queue.clone())
        .route("*", ["async"])
        .build()
}

async fn dispatch_three(queue: &Arc<InMemoryTransport>) {
    let bus = producer(queue);
    bus.dispatch(Invoice { id: 1 }).await.unwrap();
    bus.dispatch(
        Envelope::new(Mail {
            to: "ada@example.com".into(),
        })
        .with(DelayStamp(Duration::from_secs(60)))
        .with(PriorityStamp(7)),
    )
    .await
    .unwrap();
    bus.dispatch(Invoice { id: 2 }).await.unwrap();
}

#[tokio::test]
async fn dispatched_messages_are_found_by_type_decoded_with_their_stamps() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;

    let mail = queue.assert_dispatched::<Mail>();
    assert_eq!(mail.to, "ada@example.com");
    assert_eq!(
        mail.stamp::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_secs(60)))
    );
    assert_eq!(mail.stamp::<PriorityStamp>(), Some(&PriorityStamp(7)));
    assert_eq!(mail.position(), 2);
    assert!(mail.envelope().id().is_some(), "the transport's id");

    // In order, each checked off once.
    assert_eq!(queue.assert_dispatched::<Invoice>().id, 1);
    assert_eq!(queue.assert_dispatched::<Invoice>().id, 2);
    queue.assert_nothing_else_dispatched();
    // `dispatched` sees them all, checked off or not.
    assert_eq!(queue.dispatched::<Invoice>().len(), 2);
}

#[tokio::test]
async fn a_predicate_picks_the_message_and_times_takes_them_all() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    assert_eq!(
        queue.assert_dispatched_where::<Invoice>(|i| i.id == 2).id,
        2
    );
    let rest = queue.assert_dispatched_times::<Invoice>(1);
    assert_eq!(rest[0].id, 1);
    queue.assert_not_dispatched::<SentToFailureTransportMarker>();
    queue.assert_dispatched::<Mail>();
    queue.assert_nothing_else_dispatched();
}

/// A type never dispatched.
#[derive(Debug, Serialize, Deserialize)]
struct SentToFailureTransportMarker;
impl courier_core::Message for SentToFailureTransportMarker {
    const NAME: &'static str = "test.never";
}

#[tokio::test]
#[should_panic(
    expected = "expected a `test.never` message (testing::SentToFailureTransportMarker) dispatched to `in-memory`, found none not checked off yet; dispatched there:\n  #1 `test.invoice`"
)]
async fn asserting_a_message_never_dispatched_panics_listing_what_was() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    queue.assert_dispatched::<SentToFailureTransportMarker>();
}

#[tokio::test]
#[should_panic(expected = "found none not checked off yet; nothing was dispatched there")]
async fn asserting_on_an_empty_transport_panics() {
    let queue = Arc::new(InMemoryTransport::new());
    queue.assert_dispatched::<Invoice>();
}

#[tokio::test]
#[should_panic(
    expected = "#1 `test.invoice` stamps [bus-name, message-id, sent, transport-message-id] (checked off)"
)]
async fn a_message_checked_off_is_not_found_twice() {
    let queue = Arc::new(InMemoryTransport::new());
    producer(&queue).dispatch(Invoice { id: 1 }).await.unwrap();
    queue.assert_dispatched::<Invoice>();
    queue.assert_dispatched::<Invoice>();
}

#[tokio::test]
#[should_panic(
    expected = "expected a `test.invoice` message (testing::Invoice) matching the predicate"
)]
async fn a_predicate_that_matches_nothing_panics() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    queue.assert_dispatched_where::<Invoice>(|i| i.id == 3);
}

#[tokio::test]
#[should_panic(
    expected = "expected nothing else dispatched to `in-memory`, found 1 message(s) not checked off"
)]
async fn something_else_dispatched_panics() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    queue.assert_dispatched_times::<Invoice>(2);
    queue.assert_nothing_else_dispatched();
}

#[tokio::test]
#[should_panic(
    expected = "expected no `test.mail` message (testing::Mail) dispatched to `in-memory`, found 1; dispatched there:"
)]
async fn a_message_that_should_not_be_dispatched_panics() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    queue.assert_not_dispatched::<Mail>();
}

#[tokio::test]
#[should_panic(
    expected = "expected 3 `test.invoice` message(s) (testing::Invoice) dispatched to `in-memory` (not checked off yet), found 2"
)]
async fn the_wrong_count_panics() {
    let queue = Arc::new(InMemoryTransport::new());
    dispatch_three(&queue).await;
    queue.assert_dispatched_times::<Invoice>(3);
}

/// A handler that dispatches a mail delayed by three days, and fails its first two attempts.
fn flaky_bus(queue: &Arc<InMemoryTransport>, attempts: &Arc<AtomicUsize>) -> MessageBus {
    let attempts = attempts.clone();
    MessageBus::builder()
        .transport("async", queue.clone())
        .route("*", ["async"])
        .handler_fn("bill", move |m: Arc<Invoice>| {
            let attempts = attempts.clone();
            async move {
                if attempts.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(HandlerError::msg("the provider is down"));
                }
                let bus = MessageBus::current().unwrap();
                let mail = Mail {
                    to: format!("invoice-{}@example.com", m.id),
                };
                bus.dispatch(Envelope::new(mail).with(DelayStamp(Duration::from_secs(3 * 86_400))))
                    .await?;
                Ok(())
            }
        })
        .handler_fn("mail", |_: Arc<Mail>| async { Ok::<(), HandlerError>(()) })
        .build()
}

#[tokio::test(start_paused = true)]
async fn run_until_empty_goes_through_retries_and_delays_on_the_paused_clock() {
    let queue = Arc::new(InMemoryTransport::new());
    let attempts = Arc::new(AtomicUsize::new(0));
    let bus = flaky_bus(&queue, &attempts);
    bus.dispatch(Invoice { id: 9 }).await.unwrap();
    let start = tokio::time::Instant::now();

    let worker = Worker::builder(bus)
        .receiver("async", queue.clone())
        .build();
    let stats = run_until_empty(worker).await.unwrap();

    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "two failures, then done"
    );
    assert_eq!(stats.retried, 2);
    assert_eq!(
        stats.handled, 2,
        "the invoice, then the mail three days later"
    );
    assert!(
        start.elapsed() >= Duration::from_secs(3 * 86_400),
        "tokio's clock went past the delay"
    );
    assert_eq!(
        queue.acked().len(),
        4,
        "two attempts acked by their retry, then the two done"
    );
    // The worker's two retries are sends, not dispatches.
    assert_eq!(queue.sent().len(), 4);
    assert_eq!(queue.assert_dispatched::<Invoice>().id, 9);
    let mail = queue.assert_dispatched::<Mail>();
    assert_eq!(mail.to, "invoice-9@example.com");
    assert_eq!(
        mail.stamp::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_secs(3 * 86_400)))
    );
    queue.assert_nothing_else_dispatched();
}

#[tokio::test(start_paused = true)]
async fn a_move_to_a_failure_transport_is_a_dispatch_there() {
    let queue = Arc::new(InMemoryTransport::new());
    let failed = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("*", ["async"])
        .handler_fn("bill", |_: Arc<Invoice>| async {
            Err::<(), _>(HandlerError::unrecoverable("no such customer"))
        })
        .build();
    bus.dispatch(Invoice { id: 4 }).await.unwrap();
    let worker = Worker::builder(bus)
        .receiver("async", queue.clone())
        .failure_transport("failed", failed.clone())
        .build();
    let stats = run_until_empty(worker).await.unwrap();
    assert_eq!(stats.failed, 1);
    let moved = failed.assert_dispatched::<Invoice>();
    assert_eq!(moved.id, 4);
    assert!(moved.stamp::<SentToFailureTransportStamp>().is_some());
    failed.assert_nothing_else_dispatched();
}

#[tokio::test(start_paused = true)]
async fn run_until_empty_returns_at_once_when_there_is_nothing() {
    let queue = Arc::new(InMemoryTransport::new());
    let start = tokio::time::Instant::now();
    let worker = Worker::builder(producer(&queue))
        .receiver("async", queue.clone())
        .build();
    let stats = run_until_empty(worker).await.unwrap();
    assert_eq!(stats.received, 0);
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "no waiting for a limit"
    );
    queue.assert_nothing_else_dispatched();
}

#[tokio::test(start_paused = true)]
#[should_panic(
    expected = "run_until_empty: after 600s of tokio time the worker's transports still hold messages (`async`: 1 message(s) [test.invoice])"
)]
async fn run_until_empty_gives_up_on_a_message_that_never_goes() {
    let queue = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("*", ["async"])
        .handler_fn("bill", |_: Arc<Invoice>| async {
            Err::<(), _>(HandlerError::msg("always down"))
        })
        .build();
    bus.dispatch(Invoice { id: 1 }).await.unwrap();
    // No failure transport: after its retries, the message stays for redelivery, forever.
    let worker = Worker::builder(bus).receiver("async", queue).build();
    let _ = run_until_empty_within(worker, Duration::from_secs(600)).await;
}

#[tokio::test]
async fn a_transport_that_cannot_count_is_refused_by_name() {
    let bus = MessageBus::builder().build();
    let worker = Worker::builder(bus)
        .receiver(
            "direct",
            Arc::new(SyncTransport::new(
                "direct",
                courier_core::BusLink::default(),
            )),
        )
        .build();
    match run_until_empty(worker).await {
        Err(WorkerError::InvalidOption { reason, .. }) => {
            assert!(
                reason.contains("`direct` cannot count its messages"),
                "{reason}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
