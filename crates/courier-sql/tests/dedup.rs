//! Deduplication on dispatch (`DeduplicateStamp`) in `<table>_dedup`: of 100 concurrent
//! dispatches with one key exactly one is enqueued, on every dialect; once the key's row has
//! expired (rewritten in SQL) the key is taken again. The key follows the message's write: a
//! `dispatch_in` rolled back leaves it free at once, and a send that fails leaves no key behind.
//! Expired keys are pruned by the transport in passes of at most 1,000 rows: 100,000 of them are
//! gone after 100 keyed dispatches.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use courier_core::{MessageCount, Transport};
use courier_sql::{SqlDatabase, dispatch_in};
use courier_test::{TestMessage, dedup};

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

/// A `dispatch_in` rolled back takes its key back with it: the same key dispatches again at
/// once (in another transaction, then committed); once committed it is held, for `dispatch`
/// and `dispatch_in` alike.
async fn a_rolled_back_dispatch_in_leaves_its_key_free<DB>(
    pool: sqlx::Pool<DB>,
    h: common::SqlHarness,
) where
    DB: SqlDatabase,
    DB::Connection: 'static,
{
    let (t, table) = h.make("").await;
    let bus = dedup::bus(t.clone());
    let mut tx = pool.begin().await.unwrap();
    let first = dispatch_in(&bus, &mut tx, dedup::keyed("order-7", 1))
        .await
        .unwrap();
    assert!(dedup::was_sent(&first));
    tx.rollback().await.unwrap();
    assert_eq!(
        h.admin.count(&format!("{table}_dedup")).await,
        0,
        "the key rolled back with the message"
    );

    let mut tx = pool.begin().await.unwrap();
    let second = dispatch_in(&bus, &mut tx, dedup::keyed("order-7", 2))
        .await
        .unwrap();
    assert!(
        dedup::was_sent(&second),
        "the key of a rolled-back dispatch_in is free at once"
    );
    tx.commit().await.unwrap();

    let third = dedup::try_dispatch(&bus, "order-7", 3).await.unwrap();
    assert!(!dedup::was_sent(&third), "a committed key is held");
    let mut tx = pool.begin().await.unwrap();
    let fourth = dispatch_in(&bus, &mut tx, dedup::keyed("order-7", 4))
        .await
        .unwrap();
    assert!(
        !dedup::was_sent(&fourth),
        "a committed key is held in a transaction too"
    );
    tx.commit().await.unwrap();

    let got = t.get(10).await.unwrap();
    let seqs: Vec<u64> = got
        .iter()
        .filter_map(|e| e.message::<TestMessage>().map(|m| m.seq))
        .collect();
    assert_eq!(seqs, [2], "only the committed message is stored");
    t.ack_batch(&got).await.unwrap();
}

/// A send that fails (the message table is gone) frees the key it took: once the table is
/// back, the same key is sent.
async fn a_failed_send_frees_its_key(h: common::SqlHarness) {
    let (t, table) = h.make("").await;
    let bus = dedup::bus(t.clone());
    h.admin
        .exec(&format!("ALTER TABLE {table} RENAME TO {table}_away"), &[])
        .await;
    let failed = dedup::try_dispatch(&bus, "order-9", 1).await;
    h.admin
        .exec(&format!("ALTER TABLE {table}_away RENAME TO {table}"), &[])
        .await;
    assert!(
        failed.is_err(),
        "the insert fails without its table: {failed:?}"
    );
    assert_eq!(
        h.admin.count(&format!("{table}_dedup")).await,
        0,
        "no key is left behind by a failed send"
    );
    let again = dedup::try_dispatch(&bus, "order-9", 2).await.unwrap();
    assert!(dedup::was_sent(&again), "the key of a failed send is free");
    assert_eq!(t.message_count().await.unwrap(), 1);
}

/// 100,000 expired keys (and one live one) in the table: each keyed dispatch prunes at most
/// 1,000 of them, so the first leaves 99,000, and after 100 dispatches none is left while every
/// live key stays.
async fn expired_keys_are_pruned_in_bounded_passes(h: common::SqlHarness) {
    let (t, table) = h.make("").await;
    let bus = dedup::bus(t.clone());
    let dedup_table = format!("{table}_dedup");
    let now = h.admin.now();
    h.admin
        .exec(
            &format!(
                "INSERT INTO {dedup_table} (dedup_key, expires_at) VALUES ('live', {now} + 3600000)"
            ),
            &[],
        )
        .await;
    // 100,000 keys that expired long ago: `old-0` .. `old-99999`.
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let n = "(a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d)";
    let key = match &h.admin {
        #[cfg(feature = "mysql")]
        common::Admin::MySql(_) => format!("CONCAT('old-', {n})"),
        #[allow(unreachable_patterns, reason = "one database per feature set")]
        _ => format!("'old-' || CAST({n} AS VARCHAR(10))"),
    };
    let inserted = h
        .admin
        .exec(
            &format!(
                "INSERT INTO {dedup_table} (dedup_key, expires_at) SELECT {key}, 1000 + {n} \
                 FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f"
            ),
            &[],
        )
        .await;
    assert_eq!(inserted, 100_000);
    let expired = format!("{dedup_table} WHERE expires_at <= {now}");
    assert_eq!(h.admin.count(&expired).await, 100_000);

    assert!(dedup::was_sent(
        &dedup::try_dispatch(&bus, "fresh-0", 0).await.unwrap()
    ));
    assert_eq!(
        h.admin.count(&expired).await,
        99_000,
        "one pass prunes 1,000 expired keys, no more"
    );
    for i in 1..100 {
        let key = format!("fresh-{i}");
        assert!(dedup::was_sent(
            &dedup::try_dispatch(&bus, &key, i).await.unwrap()
        ));
    }
    assert_eq!(
        h.admin.count(&expired).await,
        0,
        "every expired key is pruned"
    );
    assert_eq!(
        h.admin.count(&dedup_table).await,
        101,
        "the live keys stay: `live` and `fresh-0` .. `fresh-99`"
    );
    assert!(!dedup::was_sent(
        &dedup::try_dispatch(&bus, "live", 1).await.unwrap()
    ));
    assert_eq!(t.message_count().await.unwrap(), 100);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_rolled_back_dispatch_in_leaves_its_key_free() {
    let h = common::sqlite().await;
    let common::Admin::Sqlite(pool) = &h.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    a_rolled_back_dispatch_in_leaves_its_key_free(pool, h).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_a_rolled_back_dispatch_in_leaves_its_key_free() {
    let h = common::postgres().await;
    let pool = h.admin.postgres().clone();
    a_rolled_back_dispatch_in_leaves_its_key_free(pool, h).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_a_rolled_back_dispatch_in_leaves_its_key_free() {
    let h = common::mysql().await;
    let common::Admin::MySql(pool) = &h.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    a_rolled_back_dispatch_in_leaves_its_key_free(pool, h).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_failed_send_frees_its_key() {
    a_failed_send_frees_its_key(common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_a_failed_send_frees_its_key() {
    a_failed_send_frees_its_key(common::postgres().await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_a_failed_send_frees_its_key() {
    a_failed_send_frees_its_key(common::mysql().await).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_expired_keys_are_pruned_in_bounded_passes() {
    expired_keys_are_pruned_in_bounded_passes(common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_expired_keys_are_pruned_in_bounded_passes() {
    expired_keys_are_pruned_in_bounded_passes(common::postgres().await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_expired_keys_are_pruned_in_bounded_passes() {
    expired_keys_are_pruned_in_bounded_passes(common::mysql().await).await;
}
