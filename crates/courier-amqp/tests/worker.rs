//! The core worker over the AMQP transport: every message handled once successfully, failing
//! ones retried through the transport's delay topology, nothing left behind. (This once caught
//! a deadlock: the worker flushes acks while a retry's future is parked mid-ack.)

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{AmqpHarness, OP};
use courier_core::{
    CancellationToken, Envelope, HandlerError, MessageBus, MultiplierRetryStrategy, Transport,
    Worker,
};
use courier_test::TestMessage;
use tokio::time::{Instant, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn the_worker_handles_everything_and_retries_failures_through_delays() {
    const N: u64 = 200;
    let h = AmqpHarness::new();
    let name = AmqpHarness::unique("courier_amqp_worker");
    let t = h.make(AmqpHarness::options(&name)).await;
    let transport: Arc<dyn Transport> = t.clone();

    // seq -> attempts; odd seqs fail on their first attempt.
    let attempts: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let done: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let (a, d) = (attempts.clone(), done.clone());
    let bus = MessageBus::builder()
        .transport(name.clone(), transport.clone())
        .route("courier.test", [name.clone()])
        .handler_fn("flaky", move |m: Arc<TestMessage>| {
            let (a, d) = (a.clone(), d.clone());
            async move {
                let n = {
                    let mut a = a.lock().unwrap();
                    let n = a.entry(m.seq).or_default();
                    *n += 1;
                    *n
                };
                if m.seq % 2 == 1 && n == 1 {
                    return Err(HandlerError::recoverable(
                        "first attempt fails",
                        Some(Duration::from_millis(300)),
                    ));
                }
                d.lock().unwrap().insert(m.seq);
                Ok(())
            }
        })
        .build();

    timeout(
        OP,
        transport.send_batch((0..N).map(|s| Envelope::new(TestMessage::new(s))).collect()),
    )
    .await
    .unwrap()
    .unwrap();

    let shutdown = CancellationToken::new();
    let worker = Worker::builder(bus)
        .receiver(name.clone(), transport.clone())
        .retry_strategy(Arc::new(
            MultiplierRetryStrategy::default()
                .max_retries(3)
                .jitter(0.0),
        ))
        .fetch_size(32)
        .build();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.lock().unwrap().len() < N as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "handled {} of {N}; attempts {:?}",
        done.lock().unwrap().len(),
        attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| **n > 1)
            .count()
    );
    shutdown.cancel();
    let stats = timeout(Duration::from_secs(40), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    let done = done.lock().unwrap().clone();
    assert_eq!(done.len(), N as usize, "handled: {} of {N}", done.len());
    let attempts = attempts.lock().unwrap().clone();
    for (s, n) in &attempts {
        let expected = if s % 2 == 1 { 2 } else { 1 };
        assert_eq!(*n, expected, "message {s} ran {n} times");
    }
    assert_eq!(stats.handled, N, "{stats:?}");
    assert_eq!(stats.retried, N / 2, "{stats:?}");
    let count = timeout(OP, t.abilities().message_count.unwrap().message_count())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count, 0);
}
