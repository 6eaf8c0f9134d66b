//! PostgreSQL wake-up latency: with a consumer idle in `get`, a sent message reaches it through
//! LISTEN/NOTIFY, not a poll: p50 under 50 ms over 20 samples (the poll window is 5 s, so a
//! polling transport would take seconds).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::{Duration, Instant};

use courier_core::{Envelope, Transport};
use courier_test::TestMessage;

const SAMPLES: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn an_idle_postgres_consumer_is_woken_by_notify_within_50ms_p50() {
    let h = common::postgres().await;
    let (consumer, table) = h.make("&poll_window=5s").await;
    let producer = h.reuse(&table).await;
    // Let the listener come up (the first get starts it).
    let _ = tokio::time::timeout(Duration::from_secs(10), consumer.get(1))
        .await
        .unwrap()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Instant>(1);
    let c = consumer.clone();
    let task = tokio::spawn(async move {
        let mut got = 0;
        while got < SAMPLES {
            let batch = c.get(1).await.unwrap();
            let at = Instant::now();
            for e in &batch {
                c.ack(e).await.unwrap();
                got += 1;
                tx.send(at).await.unwrap();
            }
        }
    });
    let mut latencies = Vec::new();
    let mut sends = Vec::new();
    for i in 0..SAMPLES {
        // Give the consumer time to go back to waiting.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        producer
            .send(Envelope::new(TestMessage::new(i as u64)))
            .await
            .unwrap();
        sends.push(sent.elapsed());
        let received = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        latencies.push(received.duration_since(sent));
    }
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    latencies.sort();
    sends.sort();
    println!("send alone: p50 {:?}", sends[SAMPLES / 2]);
    let p50 = latencies[SAMPLES / 2];
    let p90 = latencies[SAMPLES * 9 / 10];
    println!(
        "send -> get latency over {SAMPLES} samples: p50 {p50:?}, p90 {p90:?}, max {:?}",
        latencies[SAMPLES - 1]
    );
    assert!(
        p50 < Duration::from_millis(50),
        "p50 {p50:?} is not under 50 ms"
    );
}

/// A dropped transport's `LISTEN` session ends with it: its listener task does not outlive it
/// holding a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn a_dropped_postgres_transport_stops_listening() {
    let h = common::postgres().await;
    // The harness's transport makes the tables (and drops them at the end); this one is ours.
    let (_, table) = h.make("").await;
    let dsn = courier_core::Dsn::parse(&format!("{}?table_name={table}&poll_window=200ms", h.base))
        .unwrap();
    let t = courier_sql::SqlTransport::connect("listen", &dsn, courier_test::registry())
        .await
        .unwrap();
    let pool = h.admin.postgres();
    let listening = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%' AND query LIKE '%' || $1 || '%'",
        )
        .bind(&table)
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while listening().await == 0 {
        // The first get starts the listener.
        let _ = t.get(1).await.unwrap();
        assert!(Instant::now() < deadline, "the listener never came up");
    }
    drop(t);
    let deadline = Instant::now() + Duration::from_secs(10);
    while listening().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the LISTEN session outlived its transport"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
