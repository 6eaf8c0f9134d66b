//! Deduplication on dispatch (`DeduplicateStamp`) in `<table>_dedup`: of 100 concurrent
//! dispatches with one key exactly one is enqueued, on every dialect; once the key's row has
//! expired (rewritten in SQL) the key is taken again.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use courier_core::MessageCount;
use courier_test::dedup;

async fn exactly_one_then_again_after_expiry(h: common::SqlHarness) {
    let (t, table) = h.make("").await;
    let bus = dedup::bus(t.clone());
    dedup::concurrent_dispatches_send_exactly_one(&bus, "order-42", 100).await;
    assert_eq!(t.message_count().await.unwrap(), 1);
    let hour = Duration::from_secs(3600);
    assert!(!dedup::dispatch_once(&bus, "order-42", hour).await);
    assert!(dedup::dispatch_once(&bus, "order-43", hour).await);
    // The key's TTL passes: rewrite its row as expired.
    let now = h.admin.now();
    let expired = h
        .admin
        .exec(
            &format!("UPDATE {table}_dedup SET expires_at = {now} - 1 WHERE dedup_key = ?"),
            &["order-42"],
        )
        .await;
    assert_eq!(expired, 1);
    assert!(dedup::dispatch_once(&bus, "order-42", hour).await);
    assert!(!dedup::dispatch_once(&bus, "order-42", hour).await);
    assert_eq!(t.message_count().await.unwrap(), 3);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_deduplicates_concurrent_dispatches_and_frees_expired_keys() {
    exactly_one_then_again_after_expiry(common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_deduplicates_concurrent_dispatches_and_frees_expired_keys() {
    exactly_one_then_again_after_expiry(common::postgres().await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_deduplicates_concurrent_dispatches_and_frees_expired_keys() {
    exactly_one_then_again_after_expiry(common::mysql().await).await;
}
