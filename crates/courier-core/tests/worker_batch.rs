//! Batch handlers under the worker, over the in-memory transport on tokio's paused clock:
//! batches of `size`, the wait-at-most flush, a failing message retried alone, and the partial
//! batch run when the worker stops.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::{
    BatchOptions, CancellationToken, HandlerError, HandlerOptions, InMemoryTransport, MessageBus,
    MessageCount, Worker, WorkerStats,
};
use tokio::time::Instant;

/// The batches the handler was called with (job numbers) and when.
type Calls = Arc<Mutex<Vec<(Duration, Vec<u32>)>>>;

/// A bus whose batch handler records its calls and fails each job in `fail` the first time.
fn bus(options: BatchOptions, fail: &'static [u32]) -> (MessageBus, Calls) {
    let calls: Calls = Arc::default();
    let log = calls.clone();
    let started = Instant::now();
    let bus = MessageBus::builder()
        .batch_handler_fn(
            HandlerOptions::new("bulk"),
            options,
            move |jobs: Vec<Arc<Job>>| {
                let numbers: Vec<u32> = jobs.iter().map(|j| j.0).collect();
                let mut calls = log.lock().unwrap();
                let seen_before = |n: u32| calls.iter().any(|(_, b)| b.contains(&n));
                let results = numbers
                    .iter()
                    .map(|n| {
                        if fail.contains(n) && !seen_before(*n) {
                            Err(HandlerError::msg("this row was refused"))
                        } else {
                            Ok(())
                        }
                    })
                    .collect();
                calls.push((started.elapsed(), numbers));
                async move { results }
            },
        )
        .build();
    (bus, calls)
}

async fn consume(
    bus: MessageBus,
    q: Arc<InMemoryTransport>,
    stop: CancellationToken,
) -> WorkerStats {
    Worker::builder(bus)
        .receiver("async", q)
        .sleep(Duration::from_millis(50))
        .build()
        .run(stop)
        .await
        .unwrap()
}

fn stop_after(after: Duration) -> CancellationToken {
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        s.cancel();
    });
    stop
}

#[tokio::test(start_paused = true)]
async fn a_thousand_messages_in_batches_of_50_make_20_calls() {
    let q = queue_with(1_000).await;
    let (bus, calls) = bus(BatchOptions::new(50, Duration::from_secs(3_600)), &[]);
    let stats = consume(bus, q.clone(), stop_after(Duration::from_secs(10))).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        20,
        "{:?}",
        calls.iter().map(|c| c.1.len()).collect::<Vec<_>>()
    );
    assert!(calls.iter().all(|(_, b)| b.len() == 50));
    let mut all: Vec<u32> = calls.iter().flat_map(|(_, b)| b.clone()).collect();
    all.sort_unstable();
    assert_eq!(all, (0..1_000).collect::<Vec<_>>(), "each message once");
    assert_eq!(stats.handled, 1_000);
    assert_eq!(q.message_count().await.unwrap(), 0, "all acked");
}

#[tokio::test(start_paused = true)]
async fn a_partial_batch_is_handled_once_its_wait_is_over() {
    let q = queue_with(7).await;
    let (bus, calls) = bus(BatchOptions::new(50, Duration::from_secs(2)), &[]);
    let stats = consume(bus, q.clone(), stop_after(Duration::from_secs(5))).await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (at, batch) = &calls[0];
    assert_eq!(batch.len(), 7);
    assert!(
        *at >= Duration::from_secs(2) && *at < Duration::from_millis(2_500),
        "called when the wait was over: {at:?}"
    );
    assert_eq!(stats.handled, 7);
    assert_eq!(q.message_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failing_message_of_a_batch_is_retried_alone() {
    let q = queue_with(5).await;
    let (bus, calls) = bus(BatchOptions::new(5, Duration::from_secs(10)), &[2]);
    let stats = consume(bus, q.clone(), stop_after(Duration::from_secs(30))).await;
    let calls = calls.lock().unwrap().clone();
    let batches: Vec<&Vec<u32>> = calls.iter().map(|(_, b)| b).collect();
    assert_eq!(
        batches,
        [&vec![0, 1, 2, 3, 4], &vec![2]],
        "only 2 came back"
    );
    assert!(
        calls[1].0 >= Duration::from_secs(1),
        "after the retry strategy's delay: {:?}",
        calls[1].0
    );
    assert_eq!((stats.handled, stats.retried, stats.failed), (5, 1, 1));
    assert_eq!(q.message_count().await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_stopping_worker_runs_its_partial_batch_at_once() {
    let q = queue_with(7).await;
    let (bus, calls) = bus(BatchOptions::new(50, Duration::from_secs(3_600)), &[]);
    let started = Instant::now();
    let stats = consume(bus, q.clone(), stop_after(Duration::from_millis(100))).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait for the batch: {:?}",
        started.elapsed()
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].1.len(), 7);
    assert_eq!(stats.handled, 7);
    assert_eq!(
        q.message_count().await.unwrap(),
        0,
        "nothing lost, nothing left"
    );
}
