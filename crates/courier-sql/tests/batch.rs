//! A batch handler under the worker on SQLite: 1,000 messages in batches of 50 make exactly 20
//! calls, each message handled once and acked.

#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    BatchOptions, CancellationToken, Envelope, HandlerError, HandlerOptions, MessageBus,
    MessageCount, Transport, Worker,
};
use courier_test::TestMessage;

async fn timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("operation timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_in_batches_of_50_make_20_calls() {
    let h = common::sqlite().await;
    let (t, _table) = h.make("").await;
    let envelopes: Vec<_> = (0..1_000)
        .map(|i| Envelope::new(TestMessage::new(i)))
        .collect();
    for chunk in envelopes.chunks(250) {
        timeout(t.send_batch(chunk.to_vec())).await.unwrap();
    }
    let calls: Arc<Mutex<Vec<Vec<u64>>>> = Arc::default();
    let log = calls.clone();
    let bus = MessageBus::builder()
        .batch_handler_fn(
            HandlerOptions::new("bulk"),
            // The wait never runs out here: only full batches are handled.
            BatchOptions::new(50, Duration::from_secs(3_600)),
            move |batch: Vec<Arc<TestMessage>>| {
                log.lock()
                    .unwrap()
                    .push(batch.iter().map(|m| m.seq).collect());
                let results = batch.iter().map(|_| Ok::<(), HandlerError>(())).collect();
                async move { results }
            },
        )
        .build();
    let stats = timeout(
        Worker::builder(bus)
            .receiver("async", t.clone())
            .limit(1_000)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![50; 20],
        "20 calls of 50"
    );
    let mut all: Vec<u64> = calls.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..1_000).collect::<Vec<_>>(), "each message once");
    assert_eq!(stats.handled, 1_000);
    assert_eq!(timeout(t.message_count()).await.unwrap(), 0, "all acked");
}
