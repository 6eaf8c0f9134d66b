//! Courier and real Symfony Messenger 5.4 (PHP, Debian's packages) on one Doctrine table
//! `messenger_messages`, on SQLite, PostgreSQL and MariaDB: each side consumes what the other sends, a
//! retry crosses sides with its count, both consume one queue together with none lost or
//! doubled, and a message Courier cannot read lands in its failure transport.
//!
//! Run with `--include-ignored` after `scripts/services` (PHP, PostgreSQL, MariaDB).

#![cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono_tz::Tz;
use common::{Db, Kind, SendEmail, consumed, email, ids, php};
use courier_core::{
    CancellationToken, DelayStamp, Envelope, ErrorDetailsStamp, HandlerError, MessageBus,
    MultiplierRetryStrategy, PriorityStamp, RedeliveryStamp, Transport, Worker,
};
use courier_symfony::DoctrineTransport;

const PHP_LIMIT: Duration = Duration::from_secs(120);

async fn timeout<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("operation timed out")
}

/// Receives and acks until `n` envelopes came (or `within` passed): what came.
async fn drain(t: &DoctrineTransport, n: usize, within: Duration) -> Vec<Envelope> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n && start.elapsed() < within {
        let batch = timeout(t.get(100)).await.unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        timeout(t.ack_batch(&batch)).await.unwrap();
        got.extend(batch);
    }
    got
}

/// One number from the database of `db`.
async fn scalar(db: &Db, kind: Kind, sql: &str) -> i64 {
    let sql = sql.replace("{t}", &db.table);
    match kind {
        Kind::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap()
        }
        Kind::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap()
        }
        Kind::Mysql => {
            let pool = sqlx::MySqlPool::connect(&db.url).await.unwrap();
            sqlx::query_scalar(&sql).fetch_one(&pool).await.unwrap()
        }
    }
}

/// Runs a statement on the database of `db`.
async fn exec(db: &Db, kind: Kind, sql: &str) {
    let sql = sql.replace("{t}", &db.table);
    match kind {
        Kind::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
        Kind::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
        Kind::Mysql => {
            let pool = sqlx::MySqlPool::connect(&db.url).await.unwrap();
            sqlx::query(&sql).execute(&pool).await.unwrap();
        }
    }
}

/// Moves every lease two hours back: past PHP's redelivery horizon of an hour.
async fn expire_leases(db: &Db, kind: Kind) {
    let sql = match kind {
        Kind::Sqlite => "UPDATE {t} SET delivered_at = datetime(delivered_at, '-2 hours')",
        Kind::Postgres => "UPDATE {t} SET delivered_at = delivered_at - interval '2 hours'",
        Kind::Mysql => "UPDATE {t} SET delivered_at = delivered_at - INTERVAL 2 HOUR",
    };
    exec(db, kind, sql).await;
}

/// The rows not yet handled: on MySQL / MariaDB PHP acks by setting `delivered_at` to
/// 9999-12-31 (and deletes those rows on its next fetch), elsewhere it deletes the row.
const PENDING: &str =
    "SELECT COUNT(*) FROM {t} WHERE delivered_at IS NULL OR delivered_at < '9999-01-01 00:00:00'";

async fn a_message_courier_holds_reaches_php_only_once_its_lease_expires(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    courier_sends(&t, 1, 1, "+00:00").await;
    let held = timeout(t.get(1)).await.unwrap();
    assert_eq!(held.len(), 1);
    let php_gets = || async {
        consumed(
            &php(
                "consume.php",
                &[&db.php("default"), "1", "2"],
                "UTC",
                PHP_LIMIT,
            )
            .await,
        )
    };
    assert!(php_gets().await.is_empty(), "PHP respects Courier's lease");

    expire_leases(&db, kind).await;
    timeout(t.keepalive(&held[0])).await.unwrap();
    assert!(
        php_gets().await.is_empty(),
        "the keepalive renewed the lease"
    );

    expire_leases(&db, kind).await;
    let lines = php_gets().await;
    assert_eq!(lines.len(), 1, "PHP redelivers past its horizon: {lines:?}");
    assert_eq!(lines[0].id, Some(1));
}

async fn php_dispatches_1000_and_courier_consumes_them_all(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    php(
        "dispatch.php",
        &[&db.php("default"), "1", "1000", "10"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert_eq!(
        scalar(
            &db,
            kind,
            "SELECT COUNT(*) FROM {t} WHERE available_at > created_at"
        )
        .await,
        100,
        "every 10th message is delayed by PHP"
    );
    let got = drain(&t, 1000, Duration::from_secs(30)).await;
    let mut seen = BTreeSet::new();
    for envelope in &got {
        let message = envelope
            .message::<SendEmail>()
            .unwrap_or_else(|| panic!("{:?}", envelope.decode_error()));
        assert_eq!(message, &email(message.id, "+00:00"));
        assert!(seen.insert(message.id), "{} twice", message.id);
    }
    assert_eq!(seen, ids(1..=1000));
    assert_eq!(scalar(&db, kind, "SELECT COUNT(*) FROM {t}").await, 0);
}

/// Courier sends `email(first..first+n)`, every 10th delayed by a second, each with a stamp
/// only Courier knows (a plain header to PHP).
async fn courier_sends(t: &DoctrineTransport, first: i64, n: i64, offset: &str) {
    let envelopes = (first..first + n)
        .map(|id| {
            let envelope = Envelope::new(email(id, offset)).with(PriorityStamp(3));
            if id % 10 == 0 {
                envelope.with(DelayStamp(Duration::from_secs(1)))
            } else {
                envelope
            }
        })
        .collect();
    timeout(t.send_batch(envelopes)).await.unwrap();
}

async fn courier_dispatches_1000_and_php_consumes_them_all(kind: Kind, zone: &str) {
    let db = Db::new(kind);
    let tz: Tz = zone.parse().unwrap();
    let t = db.courier("default", tz).await;
    let offset = if zone == "UTC" { "+00:00" } else { "-04:00" };
    courier_sends(&t, 1, 1000, offset).await;
    let headers = scalar(
        &db,
        kind,
        "SELECT COUNT(*) FROM {t} WHERE headers LIKE '%x-courier-stamp-priority%' AND headers NOT LIKE '%PriorityStamp%'",
    )
    .await;
    assert_eq!(headers, 1000, "Courier's own stamps are plain headers");
    let out = php(
        "consume.php",
        &[&db.php("default"), "1000", "60"],
        zone,
        PHP_LIMIT,
    )
    .await;
    let lines = consumed(&out);
    let mut seen = BTreeSet::new();
    for line in &lines {
        let id = line.id.unwrap();
        let expected = email(id, offset);
        assert_eq!(line.class, r"App\Message\SendEmail");
        assert_eq!(line.retry, 0);
        assert_eq!(line.subject.as_deref(), Some(expected.subject.as_str()));
        let priority = if id % 2 == 0 { "high" } else { "low" };
        assert_eq!(line.priority.as_deref(), Some(priority));
        assert_eq!(
            line.sent_at.as_deref(),
            Some(format!("2024-05-06T07:08:09{offset}").as_str())
        );
        assert!(seen.insert(id), "{id} twice");
    }
    assert_eq!(seen, ids(1..=1000), "PHP consumed them all");
    assert_eq!(scalar(&db, kind, PENDING).await, 0);
}

async fn a_retry_crosses_from_php_to_courier_and_back_with_its_count(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    php(
        "dispatch.php",
        &[&db.php("default"), "1", "20"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    // PHP fails each once: Symfony's retry listener sends it again with RedeliveryStamp 1.
    let out = php(
        "consume.php",
        &[&db.php("default"), "20", "30", "fail-new"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert_eq!(consumed(&out).len(), 20);

    // Courier fails each again: its worker retries it with RedeliveryStamp 2.
    let counts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&counts);
    let bus = MessageBus::builder()
        .handler_fn("fail", move |m: Arc<SendEmail>| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(m.id);
                Err::<(), _>(HandlerError::recoverable("failed in Rust", None))
            }
        })
        .build();
    let retries = Arc::new(Mutex::new(Vec::new()));
    let on_received = Arc::clone(&retries);
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::builder(bus)
            .receiver("default", t.clone())
            .retry_strategy(Arc::new(
                MultiplierRetryStrategy::default()
                    .max_retries(3)
                    .delay(Duration::from_secs(1))
                    .jitter(0.0),
            ))
            .on_received(move |received| {
                let count = received
                    .envelope()
                    .last::<RedeliveryStamp>()
                    .map_or(0, |s| s.retry_count);
                on_received.lock().unwrap().push(count);
            })
            .limit(20)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("worker in time")
    .unwrap();
    assert_eq!(stats.retried, 20, "{stats:?}");
    assert_eq!(
        *retries.lock().unwrap(),
        vec![1; 20],
        "Courier read PHP's retry count"
    );

    let out = php(
        "consume.php",
        &[&db.php("default"), "20", "30"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    let lines = consumed(&out);
    assert_eq!(lines.len(), 20);
    assert!(
        lines.iter().all(|l| l.retry == 2),
        "PHP read Courier's retry count: {lines:?}"
    );
    assert_eq!(scalar(&db, kind, PENDING).await, 0);
}

async fn php_and_courier_workers_share_one_queue_with_none_lost_or_doubled(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    courier_sends(&t, 1, 1000, "+00:00").await;
    let dsn = db.php("default");
    let php_side =
        tokio::spawn(
            async move { php("consume.php", &[&dsn, "1000", "10"], "UTC", PHP_LIMIT).await },
        );
    let mut courier_ids = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let batch = timeout(t.get(5)).await.unwrap();
        if batch.is_empty() {
            if scalar(&db, kind, PENDING).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        courier_ids.extend(batch.iter().map(|e| e.message::<SendEmail>().unwrap().id));
        // Slower than PHP alone, so that both sides take a share.
        tokio::time::sleep(Duration::from_millis(10)).await;
        timeout(t.ack_batch(&batch)).await.unwrap();
    }
    let php_ids: Vec<i64> = consumed(&php_side.await.unwrap())
        .iter()
        .map(|l| l.id.unwrap())
        .collect();
    assert!(
        !courier_ids.is_empty() && !php_ids.is_empty(),
        "both took a share: courier {}, php {}",
        courier_ids.len(),
        php_ids.len()
    );
    let mut all: Vec<i64> = courier_ids.iter().chain(&php_ids).copied().collect();
    all.sort_unstable();
    let unique: Vec<i64> = all
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(all, unique, "none handled twice");
    assert_eq!(all, (1..=1000).collect::<Vec<_>>(), "none lost");
}

async fn a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason(
    kind: Kind,
) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    let failed = db.courier("failed", Tz::UTC).await;
    php(
        "dispatch.php",
        &[&db.php("default"), "1", "1", "0", "Unmapped"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    php(
        "dispatch.php",
        &[&db.php("default"), "2", "1", "0", "Misfit"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    let bus = MessageBus::builder()
        .handler_fn("never", |_: Arc<SendEmail>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    let stats = tokio::time::timeout(
        Duration::from_secs(60),
        Worker::builder(bus)
            .receiver("default", t.clone())
            .failure_transport("failed", failed.clone())
            .limit(2)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("worker in time")
    .unwrap();
    assert_eq!(stats.moved_to_failure, 2, "{stats:?}");
    assert_eq!(
        scalar(
            &db,
            kind,
            "SELECT COUNT(*) FROM {t} WHERE queue_name = 'default'"
        )
        .await,
        0,
        "none left to loop"
    );
    let mut moved = drain(&failed, 2, Duration::from_secs(10)).await;
    moved.sort_by_key(|e| e.message_name().to_owned());
    let reasons: Vec<(String, String)> = moved
        .iter()
        .map(|e| {
            let details = e.last::<ErrorDetailsStamp>().expect("error details");
            (e.message_name().to_owned(), details.message.clone())
        })
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert_eq!(reasons[0].0, r"App\Message\Unmapped");
    assert!(
        reasons[0].1.contains(r"App\Message\Unmapped"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, "mail.misfit");
    assert!(reasons[1].1.contains("invalid JSON body"), "{reasons:?}");
}

/// The tests on SQLite, PostgreSQL and MariaDB.
macro_rules! on_each {
    ($($name:ident $(, $arg:expr)?;)*) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs php: run scripts/services"]
                async fn $name() {
                    super::$name(Kind::Sqlite $(, $arg)?).await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs php and postgres: run scripts/services, set COURIER_TEST_POSTGRES_URL"]
                async fn $name() {
                    super::$name(Kind::Postgres $(, $arg)?).await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs php and mysql: run scripts/services, set COURIER_TEST_MYSQL_URL"]
                async fn $name() {
                    super::$name(Kind::Mysql $(, $arg)?).await;
                }
            )*
        }
    };
}

on_each! {
    a_message_courier_holds_reaches_php_only_once_its_lease_expires;
    php_dispatches_1000_and_courier_consumes_them_all;
    courier_dispatches_1000_and_php_consumes_them_all, "UTC";
    a_retry_crosses_from_php_to_courier_and_back_with_its_count;
    a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and postgres: run scripts/services, set COURIER_TEST_POSTGRES_URL"]
async fn courier_writes_wall_clock_datetimes_in_a_non_utc_php_zone() {
    courier_dispatches_1000_and_php_consumes_them_all(Kind::Postgres, "America/New_York").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and mysql: run scripts/services, set COURIER_TEST_MYSQL_URL"]
async fn mysql_courier_writes_wall_clock_datetimes_in_a_non_utc_php_zone() {
    courier_dispatches_1000_and_php_consumes_them_all(Kind::Mysql, "America/New_York").await;
}

/// On PostgreSQL and MariaDB only: on SQLite, Symfony's claim (a read, then a write, in one deferred
/// transaction) fails with `database is locked` whenever another connection writes between the
/// two, so PHP workers cannot share a SQLite queue with anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and postgres: run scripts/services, set COURIER_TEST_POSTGRES_URL"]
async fn postgres_php_and_courier_workers_share_one_queue_with_none_lost_or_doubled() {
    php_and_courier_workers_share_one_queue_with_none_lost_or_doubled(Kind::Postgres).await;
}

/// On MariaDB PHP claims with `FOR UPDATE`, Courier with `FOR UPDATE SKIP LOCKED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and mysql: run scripts/services, set COURIER_TEST_MYSQL_URL"]
async fn mysql_php_and_courier_workers_share_one_queue_with_none_lost_or_doubled() {
    php_and_courier_workers_share_one_queue_with_none_lost_or_doubled(Kind::Mysql).await;
}
