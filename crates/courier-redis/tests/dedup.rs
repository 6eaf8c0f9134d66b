//! Deduplication on dispatch (`DeduplicateStamp`) with `SET NX PX`: of 100 concurrent
//! dispatches with one key exactly one is enqueued; after the TTL the key is taken again. A
//! send that fails frees the key it took.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use common::RedisHarness;
use courier_core::MessageCount;
use courier_test::dedup;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn redis_deduplicates_concurrent_dispatches_and_frees_keys_after_their_ttl() {
    let h = RedisHarness::new();
    let stream = courier_test::env::unique_name("courier_dedup");
    let t = h.with_options(h.options(&stream)).await;
    let bus = dedup::bus(t.clone());
    dedup::concurrent_dispatches_send_exactly_one(&bus, "order-42", 100).await;
    assert_eq!(t.message_count().await.unwrap(), 1);
    let short = Duration::from_millis(150);
    assert!(dedup::dispatch_once(&bus, "short", short).await);
    assert!(!dedup::dispatch_once(&bus, "short", short).await);
    // Poll until Redis has expired the key (PX 150 ms), within a deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if dedup::dispatch_once(&bus, "short", short).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "key not free 5 s after its TTL"
        );
    }
    assert_eq!(t.message_count().await.unwrap(), 3);
    let mut conn = h.conn().await;
    let _: () = redis::cmd("DEL")
        .arg(t.dedup_key("order-42"))
        .arg(t.dedup_key("short"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// A send that fails (the stream's key holds a string: `XADD` answers `WRONGTYPE`) frees the
/// key it took: it is gone from Redis, and once the stream can be written the same key is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_failed_redis_send_frees_its_key() {
    let h = RedisHarness::new();
    let stream = courier_test::env::unique_name("courier_dedup");
    let t = h.with_options(h.options(&stream)).await;
    let bus = dedup::bus(t.clone());
    let mut conn = h.conn().await;
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&stream)
        .arg("not a stream")
        .query_async(&mut conn)
        .await
        .unwrap();
    let failed = dedup::try_dispatch(&bus, "order-9", 1).await;
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(failed.is_err(), "XADD to a string fails: {failed:?}");
    let held: i64 = redis::cmd("EXISTS")
        .arg(t.dedup_key("order-9"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(held, 0, "no key is left behind by a failed send");
    let again = dedup::try_dispatch(&bus, "order-9", 2).await.unwrap();
    assert!(dedup::was_sent(&again), "the key of a failed send is free");
    assert_eq!(t.message_count().await.unwrap(), 1);
    let _: () = redis::cmd("DEL")
        .arg(t.dedup_key("order-9"))
        .query_async(&mut conn)
        .await
        .unwrap();
}
