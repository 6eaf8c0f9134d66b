//! SQL-specific behaviour the conformance suite cannot see: delays stored in database-clock
//! milliseconds, keepalive refreshing `delivered_at`, retry as one in-place UPDATE, queues
//! sharing a table, and a `queue_name=failed` transport listing only its own rows.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use courier_core::{DelayStamp, Envelope, RedeliveryStamp, Transport};
use courier_test::TestMessage;

async fn timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("operation timed out")
}

async fn delay_is_stored_in_milliseconds_from_the_database_clock(h: &common::SqlHarness) {
    let (t, table) = h.make("").await;
    let sent = timeout(
        t.send(Envelope::new(TestMessage::new(1)).with(DelayStamp(Duration::from_millis(1_537)))),
    )
    .await
    .unwrap();
    let id = sent.id().unwrap().to_owned();
    let sql = format!(
        "UPDATE {table} SET priority = 7 WHERE CAST(id AS CHAR(20)) = ? AND available_at - created_at = 1537"
    );
    assert_eq!(
        h.admin.exec(&sql, &[&id]).await,
        1,
        "available_at = created_at + 1537 ms exactly"
    );
}

async fn keepalive_refreshes_delivered_at(h: &common::SqlHarness) {
    let (t, table) = h.make("").await;
    timeout(t.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    let got = timeout(t.get(1)).await.unwrap();
    assert_eq!(got.len(), 1);
    h.expire_table(&table).await;
    timeout(t.keepalive(&got[0])).await.unwrap();
    assert!(
        timeout(t.get(1)).await.unwrap().is_empty(),
        "a kept-alive delivery is not redelivered"
    );
    h.expire_table(&table).await;
    let again = timeout(t.get(1)).await.unwrap();
    assert_eq!(again.len(), 1, "an expired delivery is redelivered");
    // The first delivery's late keepalive and ack touch nothing.
    timeout(t.keepalive(&got[0])).await.unwrap();
    timeout(t.ack(&got[0])).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 1);
    timeout(t.ack(&again[0])).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}

async fn retry_updates_the_row_in_place(h: &common::SqlHarness) {
    let (t, table) = h.make("").await;
    let sent = timeout(t.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    let got = timeout(t.get(1)).await.unwrap().pop().unwrap();
    timeout(t.retry(got.with(RedeliveryStamp::new(1)), Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(h.admin.count(&table).await, 1, "no copy");
    let again = timeout(t.get(1)).await.unwrap().pop().unwrap();
    assert_eq!(again.id(), sent.id(), "same row");
    assert_eq!(
        again.last::<RedeliveryStamp>().map(|s| s.retry_count),
        Some(1)
    );
    timeout(t.ack(&again)).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}

async fn queues_share_a_table_without_seeing_each_other(h: &common::SqlHarness) {
    let (main, table) = h.make("").await;
    let failed = h.reuse_with(&table, "&queue_name=failed").await;
    timeout(main.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    let parked = timeout(failed.send(Envelope::new(TestMessage::new(2))))
        .await
        .unwrap();
    let listable = failed.abilities().listable.unwrap();
    let listed = timeout(listable.list(10)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].message::<TestMessage>().unwrap().seq, 2);
    assert_eq!(
        timeout(main.abilities().message_count.unwrap().message_count())
            .await
            .unwrap(),
        1
    );
    assert!(
        timeout(
            main.abilities()
                .listable
                .unwrap()
                .find(parked.id().unwrap())
        )
        .await
        .unwrap()
        .is_none()
    );
    assert!(
        timeout(listable.remove(parked.id().unwrap()))
            .await
            .unwrap()
    );
    assert_eq!(
        timeout(failed.abilities().message_count.unwrap().message_count())
            .await
            .unwrap(),
        0
    );
    assert_eq!(timeout(main.get(1)).await.unwrap().len(), 1);
}

async fn concurrent_setups_of_one_table_succeed(h: &common::SqlHarness) {
    let (_, table) = h.make("&auto_setup=false").await;
    let setups = (0..4).map(|_| h.reuse(&table));
    let transports = timeout(futures_util::future::join_all(setups)).await;
    timeout(transports[0].send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    assert_eq!(h.admin.count(&table).await, 1);
}

async fn a_large_send_batch_returns_each_rows_id(h: &common::SqlHarness) {
    let (t, _) = h.make("").await;
    let batch: Vec<Envelope> = (0..1_200)
        .map(|i| Envelope::new(TestMessage::new(i)))
        .collect();
    let sent = timeout(t.send_batch(batch)).await.unwrap();
    assert_eq!(sent.len(), 1_200);
    let listable = t.abilities().listable.unwrap();
    for (seq, e) in sent.iter().enumerate().step_by(97) {
        let found = timeout(listable.find(e.id().unwrap()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            found.message::<TestMessage>().unwrap().seq,
            seq as u64,
            "id of message {seq}"
        );
    }
}

async fn a_row_with_malformed_headers_is_named_and_keeps_its_body(h: &common::SqlHarness) {
    let (t, table) = h.make("").await;
    timeout(t.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    let now = h.admin.now();
    let sql = format!(
        "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
         VALUES (?, ?, ?, 0, {now}, {now})"
    );
    h.admin
        .exec(&sql, &[t.options().queue(), "{\"seq\":2}", "not json"])
        .await;
    let got = timeout(t.get(10)).await.unwrap();
    assert_eq!(got.len(), 2, "both rows are claimed in one batch");
    assert!(got[0].decode_error().is_none(), "the good row decodes");
    let bad = &got[1];
    assert!(
        matches!(
            bad.decode_error(),
            Some(courier_core::DecodeError::InvalidHeaders { .. })
        ),
        "{:?}",
        bad.decode_error()
    );
    let wire = courier_core::encode(bad).unwrap();
    assert_eq!(
        wire.body, "{\"seq\":2}",
        "the body is kept for the failure transport"
    );
    timeout(t.ack_batch(&got)).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}

async fn keepalive_batch_refreshes_every_live_delivery_in_one_call(h: &common::SqlHarness) {
    let (t, table) = h.make("").await;
    for n in 0..3 {
        timeout(t.send(Envelope::new(TestMessage::new(n))))
            .await
            .unwrap();
    }
    let first = timeout(t.get(2)).await.unwrap();
    let second = timeout(t.get(1)).await.unwrap();
    assert_eq!((first.len(), second.len()), (2, 1));
    let held: Vec<Envelope> = first.iter().chain(&second).cloned().collect();
    h.expire_table(&table).await;
    timeout(t.keepalive_batch(&held)).await.unwrap();
    assert!(
        timeout(t.get(3)).await.unwrap().is_empty(),
        "deliveries of two claims kept alive by one batch are not redelivered"
    );
    h.expire_table(&table).await;
    let again = timeout(t.get(3)).await.unwrap();
    assert_eq!(again.len(), 3, "expired deliveries are redelivered");
    // The superseded deliveries' batch keepalive refreshes nothing.
    timeout(t.keepalive_batch(&held)).await.unwrap();
    h.expire_table(&table).await;
    timeout(t.keepalive_batch(&held)).await.unwrap();
    assert_eq!(timeout(t.get(3)).await.unwrap().len(), 3);
}

/// A table created by the previous release (`0001` run by `.replace()`, no version table) is
/// adopted: the migration is recorded, the messages in it survive, and setup is a no-op after.
async fn a_table_from_the_previous_release_is_adopted_with_its_messages(h: &common::SqlHarness) {
    let table = h.table("courier_old");
    let dialect = match h.base.split(':').next() {
        Some("sqlite") => courier_sql::Dialect::Sqlite,
        Some("postgres") => courier_sql::Dialect::Postgres,
        _ => courier_sql::Dialect::Mysql,
    };
    let template = courier_sql::migrate::MESSAGES.list[0]
        .template(dialect)
        .unwrap();
    let ddl = courier_sql::migrate::render(template, &[("{messages}", &table)]);
    let body: String = ddl
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in body.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        h.admin.exec(statement, &[]).await;
    }
    let old = courier_core::encode_json(&Envelope::new(TestMessage::new(41))).unwrap();
    let now = h.admin.now();
    h.admin
        .exec(
            &format!(
                "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
                 VALUES ('default', ?, ?, 0, {now}, {now})"
            ),
            &[&old.body, &old.headers],
        )
        .await;
    let t = h.reuse_with(&table, "&auto_setup=false").await;
    h.made.lock().unwrap().push((t.clone(), table.clone()));
    let applied = timeout(t.migrate()).await.unwrap();
    // 0001 is found in place and recorded, then 0009 (the cursor column and table on
    // PostgreSQL, recorded without a change elsewhere), 0011 and 0012 (the concurrency key
    // column and its index; 0012 recorded without a change on PostgreSQL), 0013 (PostgreSQL's
    // index of the rows in flight, recorded without a change elsewhere); 0005-0008 create the
    // workers, schedules, pause and rate-limit tables beside it (one version table), 0006 and
    // 0010 of its own the deduplication table and its expiry index.
    assert_eq!(
        applied.iter().map(|a| a.version).collect::<Vec<_>>(),
        [1, 9, 11, 12, 13, 5, 6, 7, 8, 6, 10],
        "{applied:?}"
    );
    assert!(timeout(t.migrate()).await.unwrap().is_empty(), "up to date");
    let got = timeout(t.get(1)).await.unwrap();
    assert_eq!(got.len(), 1, "the old message survives");
    assert_eq!(got[0].message::<TestMessage>().map(|m| m.seq), Some(41));
}

macro_rules! on_every_dialect {
    ($($case:ident),*) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::common::sqlite().await).await;
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
                async fn $case() {
                    super::$case(&crate::common::postgres().await).await;
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
                async fn $case() {
                    super::$case(&crate::common::mysql().await).await;
                }
            )*
        }
    };
}

on_every_dialect!(
    delay_is_stored_in_milliseconds_from_the_database_clock,
    keepalive_refreshes_delivered_at,
    retry_updates_the_row_in_place,
    queues_share_a_table_without_seeing_each_other,
    concurrent_setups_of_one_table_succeed,
    a_large_send_batch_returns_each_rows_id,
    a_row_with_malformed_headers_is_named_and_keeps_its_body,
    keepalive_batch_refreshes_every_live_delivery_in_one_call,
    a_table_from_the_previous_release_is_adopted_with_its_messages
);
