//! 4 consumers x 5,000 messages each (20,000 in all) on one table while a producer is still
//! sending: every message handled exactly once, none delivered twice while its delivery is live,
//! the table empty at the end, and no error (deadlock, busy, serialization) surfaces.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{Envelope, Transport};
use courier_sql::SqlTransport;
use courier_test::TestMessage;

const CONSUMERS: usize = 4;
const PER_CONSUMER: u64 = 5_000;
const TOTAL: u64 = CONSUMERS as u64 * PER_CONSUMER;

#[derive(Default)]
struct Ledger {
    live: HashSet<String>,
    handled: HashMap<u64, u32>,
}

async fn four_consumers_handle_every_message_once(h: &common::SqlHarness, separate_pools: bool) {
    let started = Instant::now();
    let (first, table) = h.make("").await;
    // Separate pools on one table/file stand in for separate worker processes.
    let mut consumers: Vec<Arc<SqlTransport>> = Vec::new();
    for _ in 0..CONSUMERS {
        consumers.push(if separate_pools {
            h.reuse(&table).await
        } else {
            first.clone()
        });
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let producer = {
        let t = first.clone();
        tokio::spawn(async move {
            for chunk in 0..TOTAL / 100 {
                let batch: Vec<Envelope> = (chunk * 100..(chunk + 1) * 100)
                    .map(|i| Envelope::new(TestMessage::new(i)))
                    .collect();
                tokio::time::timeout(Duration::from_secs(30), t.send_batch(batch))
                    .await
                    .unwrap()
                    .unwrap();
            }
        })
    };
    let mut tasks = Vec::new();
    for (n, t) in consumers.into_iter().enumerate() {
        let ledger = ledger.clone();
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(240);
            let mut got = 0_u64;
            loop {
                let done = ledger.lock().unwrap().handled.len() as u64 == TOTAL;
                if done {
                    return got;
                }
                assert!(Instant::now() < deadline, "consumer {n} timed out");
                let batch = tokio::time::timeout(Duration::from_secs(30), t.get(32))
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("consumer {n}: get failed: {e}"));
                {
                    let mut l = ledger.lock().unwrap();
                    for e in &batch {
                        let id = e.id().unwrap().to_owned();
                        assert!(
                            l.live.insert(id.clone()),
                            "message {id} delivered twice while live"
                        );
                        let seq = e.message::<TestMessage>().unwrap().seq;
                        *l.handled.entry(seq).or_default() += 1;
                    }
                }
                tokio::time::timeout(Duration::from_secs(30), t.ack_batch(&batch))
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("consumer {n}: ack failed: {e}"));
                let mut l = ledger.lock().unwrap();
                for e in &batch {
                    l.live.remove(e.id().unwrap());
                }
                got += batch.len() as u64;
            }
        }));
    }
    producer.await.unwrap();
    let mut per_consumer = Vec::new();
    for t in tasks {
        per_consumer.push(t.await.unwrap());
    }
    {
        let l = ledger.lock().unwrap();
        assert_eq!(l.handled.len() as u64, TOTAL, "every message handled");
        assert!(
            l.handled.values().all(|&n| n == 1),
            "a message was handled twice"
        );
    }
    assert_eq!(per_consumer.iter().sum::<u64>(), TOTAL);
    assert_eq!(h.admin.count(&table).await, 0, "table empty at the end");
    println!(
        "{TOTAL} messages, {CONSUMERS} consumers {per_consumer:?}, {:.0} msg/s (debug build)",
        TOTAL as f64 / started.elapsed().as_secs_f64()
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_four_pools_on_one_file_handle_every_message_once() {
    four_consumers_handle_every_message_once(&common::sqlite().await, true).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_four_consumers_handle_every_message_once() {
    four_consumers_handle_every_message_once(&common::postgres().await, true).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_four_consumers_handle_every_message_once() {
    four_consumers_handle_every_message_once(&common::mysql().await, true).await;
}
