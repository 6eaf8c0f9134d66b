//! The worker over the in-memory transport, on tokio's paused clock.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{CountAcks, Job, queue_with};
use courier_core::{
    CancellationToken, Capabilities, Encoded, Envelope, ErrorDetailsStamp, HandlerError,
    InMemoryTransport, Message, MessageBus, MessageCount, MultiplierRetryStrategy, RedeliveryStamp,
    SentToFailureTransportStamp, StopReason, Transport, TransportError, TransportErrorKind, Worker,
    WorkerEvent, async_trait,
};
use serde::{Deserialize, Serialize};

fn events() -> (
    Arc<Mutex<Vec<WorkerEvent>>>,
    impl Fn(&WorkerEvent) + Send + Sync + 'static,
) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    (log, move |e: &WorkerEvent| {
        l.lock().unwrap().push(e.clone())
    })
}

fn retry_delays(log: &Mutex<Vec<WorkerEvent>>) -> Vec<Duration> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Retried { delay, .. } => Some(*delay),
            _ => None,
        })
        .collect()
}

async fn count(t: &InMemoryTransport) -> u64 {
    MessageCount::message_count(t).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_1s_2s_4s_then_go_to_the_failure_transport() {
    let q = queue_with(1).await;
    let failed = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::msg("service down"))
        })
        .build();
    let (log, listener) = events();
    let started = tokio::time::Instant::now();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .failure_transport("failed", failed.clone())
        .sleep(Duration::from_millis(50))
        .failure_limit(4)
        .listener(listener)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    let delays = retry_delays(&log);
    assert_eq!(delays.len(), 3, "{delays:?}");
    for (d, expected) in delays.iter().zip([1.0, 2.0, 4.0]) {
        let s = d.as_secs_f64();
        assert!(
            (expected * 0.9..=expected * 1.1).contains(&s),
            "delay {s}s, expected {expected}s +-10%"
        );
    }
    assert!(
        started.elapsed() >= Duration::from_secs_f64(0.9 + 1.8 + 3.6),
        "delays were waited"
    );
    assert_eq!(
        (stats.failed, stats.retried, stats.moved_to_failure),
        (4, 3, 1)
    );
    let moved = failed.sent();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0]
            .last::<SentToFailureTransportStamp>()
            .unwrap()
            .original,
        "async"
    );
    assert_eq!(moved[0].last::<RedeliveryStamp>().unwrap().retry_count, 3);
    assert_eq!(moved[0].all::<ErrorDetailsStamp>().count(), 4);
    assert!(
        moved[0]
            .last::<ErrorDetailsStamp>()
            .unwrap()
            .message
            .contains("service down")
    );
    assert_eq!(count(&q).await, 0, "original acked after the move");
    assert_eq!(stats.stop_reason, Some(StopReason::FailureLimit));
}

#[tokio::test(start_paused = true)]
async fn recoverable_errors_retry_after_their_delay_even_past_max_retries() {
    let q = queue_with(1).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let bus = MessageBus::builder()
        .handler_fn("h", move |_: Arc<Job>| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(HandlerError::recoverable(
                        "rate limited",
                        Some(Duration::from_secs(7)),
                    ))
                } else {
                    Ok(())
                }
            }
        })
        .build();
    let (log, listener) = events();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .retry_strategy(Arc::new(MultiplierRetryStrategy::default().max_retries(0)))
        .sleep(Duration::from_millis(50))
        .limit(3)
        .listener(listener)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        retry_delays(&log),
        [Duration::from_secs(7), Duration::from_secs(7)]
    );
    assert_eq!(stats.handled, 1);
    assert_eq!(count(&q).await, 0);
}

#[tokio::test(start_paused = true)]
async fn unrecoverable_errors_go_straight_to_the_failure_transport() {
    let q = queue_with(1).await;
    let failed = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::unrecoverable("invalid card"))
        })
        .build();
    let (log, listener) = events();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .failure_transport("failed", failed.clone())
        .limit(1)
        .listener(listener)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert!(retry_delays(&log).is_empty());
    assert_eq!(failed.sent().len(), 1);
    assert_eq!(
        failed.sent()[0].last::<ErrorDetailsStamp>().unwrap().class,
        "unrecoverable"
    );
    assert_eq!((stats.failed, stats.moved_to_failure), (1, 1));
    assert_eq!(count(&q).await, 0);
}

#[derive(Debug)]
struct Broken;

#[async_trait]
impl Transport for Broken {
    async fn send(&self, _: Envelope) -> Result<Envelope, TransportError> {
        Err(
            TransportError::new(TransportErrorKind::Connection, "failed")
                .with_context("server gone"),
        )
    }
    async fn get(&self, _: usize) -> Result<Vec<Envelope>, TransportError> {
        Ok(vec![])
    }
    async fn ack(&self, _: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }
    async fn reject(&self, _: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_failure_transport_leaves_the_original_unacked() {
    let q = queue_with(1).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::unrecoverable("nope"))
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .failure_transport("failed", Arc::new(Broken))
        .limit(1)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.left_for_redelivery, 1);
    assert!(q.acked().is_empty());
    assert_eq!(count(&q).await, 1, "the message is still on its transport");
}

#[tokio::test(start_paused = true)]
async fn without_a_failure_transport_a_failed_message_stays_for_redelivery() {
    let q = queue_with(1).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::unrecoverable("nope"))
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .limit(1)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.left_for_redelivery, 1);
    assert_eq!(count(&q).await, 1);
}

#[tokio::test(start_paused = true)]
async fn limit_stops_after_the_current_message_and_leaves_the_rest_available() {
    let q = queue_with(5).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .limit(2)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((stats.received, stats.handled), (2, 2));
    assert_eq!(stats.stop_reason, Some(StopReason::MessageLimit));
    assert_eq!(count(&q).await, 3);
    assert_eq!(
        q.get(10).await.unwrap().len(),
        3,
        "the rest can be received at once"
    );
}

#[tokio::test(start_paused = true)]
async fn failure_limit_stops_after_the_current_message() {
    let q = queue_with(5).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async {
            Err::<(), _>(HandlerError::unrecoverable("x"))
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .failure_transport("f", Arc::new(InMemoryTransport::new()))
        .failure_limit(2)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((stats.received, stats.failed), (2, 2));
    assert_eq!(stats.stop_reason, Some(StopReason::FailureLimit));
    assert_eq!(q.get(10).await.unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn time_limit_stops_after_the_current_message() {
    let q = queue_with(5).await;
    let bus = MessageBus::builder()
        .handler_fn("slow", |_: Arc<Job>| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok::<(), HandlerError>(())
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .time_limit(Duration::from_secs(15))
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        stats.handled, 2,
        "the message running at 15 s finishes, no other starts"
    );
    assert_eq!(stats.stop_reason, Some(StopReason::TimeLimit));
    assert_eq!(q.get(10).await.unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn concurrency_four_runs_four_handlers_at_once_and_never_more() {
    let q = queue_with(12).await;
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (r, p) = (running.clone(), peak.clone());
    let bus = MessageBus::builder()
        .handler_fn("h", move |_: Arc<Job>| {
            let (r, p) = (r.clone(), p.clone());
            async move {
                let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                r.fetch_sub(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let started = tokio::time::Instant::now();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .concurrency(4)
        .limit(12)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.handled, 12);
    assert_eq!(peak.load(Ordering::SeqCst), 4);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "12 x 1 s at 4 at once takes ~3 s"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_slow_handler_and_acks_it() {
    let q = queue_with(3).await;
    let bus = MessageBus::builder()
        .handler_fn("slow", |_: Arc<Job>| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), HandlerError>(())
        })
        .build();
    let token = CancellationToken::new();
    let worker = Worker::builder(bus).receiver("async", q.clone()).build();
    let run = tokio::spawn(worker.run(token.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let stats = run.await.unwrap().unwrap();
    assert_eq!(stats.handled, 1);
    assert_eq!(stats.stop_reason, Some(StopReason::Shutdown));
    assert_eq!(
        stats.released, 2,
        "the two unstarted messages were put back"
    );
    assert!(
        q.acked().iter().any(|e| e.message::<Job>().unwrap().0 == 0),
        "the in-flight message was acked"
    );
    assert_eq!(
        count(&q).await,
        2,
        "the unstarted ones wait for another worker"
    );
    let rest: Vec<u32> = q
        .get(10)
        .await
        .unwrap()
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect();
    assert_eq!(rest, [1, 2], "the others were put back at once");
}

#[tokio::test(start_paused = true)]
async fn shutdown_past_the_grace_period_leaves_the_message_for_redelivery() {
    let q = queue_with(1).await;
    let bus = MessageBus::builder()
        .handler_fn("stuck", |_: Arc<Job>| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok::<(), HandlerError>(())
        })
        .build();
    let token = CancellationToken::new();
    let worker = Worker::builder(bus)
        .receiver("async", q.clone())
        .grace(Duration::from_secs(2))
        .build();
    let run = tokio::spawn(worker.run(token.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    token.cancel();
    let stats = run.await.unwrap().unwrap();
    assert_eq!((stats.handled, stats.left_for_redelivery), (0, 1));
    assert!(q.acked().is_empty());
    assert_eq!(count(&q).await, 1);
}

#[tokio::test(start_paused = true)]
async fn a_retried_message_reruns_only_the_handler_that_failed() {
    let q = queue_with(1).await;
    let (good, flaky) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (g, f) = (good.clone(), flaky.clone());
    let bus = MessageBus::builder()
        .handler_fn("good", move |_: Arc<Job>| {
            g.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), HandlerError>(()) }
        })
        .handler_fn("flaky", move |_: Arc<Job>| {
            let n = f.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(HandlerError::msg("once"))
                } else {
                    Ok(())
                }
            }
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .sleep(Duration::from_millis(100))
        .limit(2)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (good.load(Ordering::SeqCst), flaky.load(Ordering::SeqCst)),
        (1, 2)
    );
    assert_eq!((stats.retried, stats.handled), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_message_goes_to_the_failure_transport() {
    let q = Arc::new(InMemoryTransport::new());
    q.send_raw(Encoded::new("{broken").header("type", "test.job"));
    let failed = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .failure_transport("failed", failed.clone())
        .limit(1)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.moved_to_failure, 1);
    let moved = failed.sent();
    assert_eq!(
        moved[0].last::<ErrorDetailsStamp>().unwrap().class,
        "decode"
    );
    assert_eq!(
        courier_core::encode(&moved[0]).unwrap().body,
        "{broken",
        "raw body kept"
    );
    assert_eq!(count(&q).await, 0);
}

#[tokio::test(start_paused = true)]
async fn acks_of_a_fetched_batch_are_flushed_together() {
    let q = queue_with(64).await;
    let counted = CountAcks::new(q.clone(), false);
    let bus = MessageBus::builder()
        .handler_fn("h", |_: Arc<Job>| async { Ok::<(), HandlerError>(()) })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", counted.clone())
        .fetch_size(32)
        .limit(64)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(stats.handled, 64);
    assert_eq!(q.acked().len(), 64);
    // The next batch of 32 is fetched once half the current one has started; acks go out per
    // batch (when it is done, or after the linger), never one per message.
    let flushes = counted.ack_batches();
    assert!(
        (2..=4).contains(&flushes),
        "acks are flushed per fetched batch, not per message: {flushes} flushes"
    );
}

#[tokio::test(start_paused = true)]
async fn receivers_are_consumed_in_priority_order() {
    let (high, low) = (queue_with(3).await, queue_with(3).await);
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    let bus = MessageBus::builder()
        .handler_fn("h", move |j: Arc<Job>| {
            o.lock().unwrap().push(j.0);
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    let (log, listener) = events();
    Worker::builder(bus)
        .receiver("high", high.clone())
        .receiver("low", low.clone())
        .fetch_size(1)
        .limit(6)
        .listener(listener)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    let from: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            WorkerEvent::Received { transport, .. } => Some(transport.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(from, ["high", "high", "high", "low", "low", "low"]);
}

/// One message on a transport with a 2 s redelivery window, and a bus whose handler takes 5 s.
async fn slow_message() -> (Arc<InMemoryTransport>, MessageBus) {
    let options =
        courier_core::InMemoryOptions::default().redeliver_timeout(Duration::from_secs(2));
    let q = Arc::new(InMemoryTransport::with_options(
        options,
        Arc::new(courier_core::MessageRegistry::new()),
    ));
    q.send(Envelope::new(Job(1))).await.unwrap();
    let bus = MessageBus::builder()
        .handler_fn("slow", |_: Arc<Job>| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), HandlerError>(())
        })
        .build();
    (q, bus)
}

#[tokio::test(start_paused = true)]
async fn keepalive_holds_a_slow_message_past_the_redelivery_window() {
    let (q, bus) = slow_message().await;
    let worker = Worker::builder(bus)
        .receiver("async", q.clone())
        .keepalive(Some(Duration::from_millis(500)))
        .limit(1)
        .build();
    let run = tokio::spawn(worker.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        q.get(10).await.unwrap().is_empty(),
        "kept alive: not redelivered while the handler runs"
    );
    let stats = run.await.unwrap().unwrap();
    assert_eq!(stats.handled, 1);
    assert_eq!(count(&q).await, 0);
}

#[tokio::test(start_paused = true)]
async fn by_default_a_slow_message_is_kept_alive_past_the_window() {
    let (q, bus) = slow_message().await;
    let worker = Worker::builder(bus)
        .receiver("async", q.clone())
        .limit(1)
        .build();
    let run = tokio::spawn(worker.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        q.get(10).await.unwrap().is_empty(),
        "kept alive at a third of the transport's window"
    );
    assert_eq!(run.await.unwrap().unwrap().handled, 1);
}

#[tokio::test(start_paused = true)]
async fn a_message_dispatched_while_handling_inherits_the_trace_context() {
    #[derive(Serialize, Deserialize)]
    struct FollowUp;
    impl Message for FollowUp {
        const NAME: &'static str = "test.follow_up";
    }
    let q = Arc::new(InMemoryTransport::new());
    let out = Arc::new(InMemoryTransport::new());
    let link = courier_core::BusLink::new();
    let l = link.clone();
    let bus = MessageBus::builder()
        .transport("out", out.clone())
        .route("test.follow_up", ["out"])
        .handler_fn("h", move |_: Arc<Job>| {
            let bus = l.get();
            async move {
                bus.unwrap()
                    .dispatch(FollowUp)
                    .await
                    .map_err(HandlerError::msg)?;
                Ok(())
            }
        })
        .link(link)
        .build();
    let trace = courier_core::TraceContextStamp {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        tracestate: None,
    };
    q.send(Envelope::new(Job(1)).with(trace.clone()))
        .await
        .unwrap();
    Worker::builder(bus)
        .receiver("async", q)
        .limit(1)
        .build()
        .run(CancellationToken::new())
        .await
        .unwrap();
    let sent = out.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].last::<courier_core::TraceContextStamp>(),
        Some(&trace)
    );
}
