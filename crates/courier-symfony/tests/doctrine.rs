//! Courier and real Symfony Messenger 5.4 (PHP, Debian's packages) on one Doctrine table
//! `messenger_messages`, on SQLite, PostgreSQL and MariaDB: each side consumes what the other sends, a
//! retry crosses sides with its count, both consume one queue together with none lost or
//! doubled, and a message Courier cannot read lands in its failure transport.
//!
//! Run with `--include-ignored` after `scripts/services` (PHP, PostgreSQL, MariaDB).

#![cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use chrono_tz::Tz;
use common::scenarios::{
    PHP_LIMIT, assert_unmapped_and_misfit, courier_drains_php_1000,
    courier_fails_php_retries_again, courier_moves_unreadable_to, courier_sends, failure_reasons,
    php_and_courier_share_1000, php_consumes_courier_1000, php_dispatches_unreadable,
    php_fails_20_once, php_reads_courier_retries, retry_strategy, timeout,
};
use common::{Db, Kind, consumed, php};
use courier_core::Transport;

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
    courier_sends(&*t, 1, 1, "+00:00").await;
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

/// A batch's acks ride on the next claim (one statement on PostgreSQL, one transaction on
/// SQLite): the acked rows are gone, the claim takes the rest and never an acked row, and a
/// claim of nothing still acks.
async fn acks_ride_on_the_next_claim(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    assert!(t.capabilities().ack_with_get);
    courier_sends(&*t, 3, 3, "+00:00").await;
    let first = timeout(t.get(2)).await.unwrap();
    assert_eq!(first.len(), 2);
    let rest = timeout(t.ack_and_get(&first, 5)).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert!(
        first.iter().all(|e| e.id() != rest[0].id()),
        "an acked row is never claimed again"
    );
    assert_eq!(scalar(&db, kind, "SELECT COUNT(*) FROM {t}").await, 1);
    assert_eq!(
        scalar(
            &db,
            kind,
            "SELECT COUNT(*) FROM {t} WHERE delivered_at IS NULL"
        )
        .await,
        0,
        "the row left is the one claimed"
    );
    assert!(timeout(t.ack_and_get(&rest, 5)).await.unwrap().is_empty());
    assert_eq!(scalar(&db, kind, "SELECT COUNT(*) FROM {t}").await, 0);
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
    courier_drains_php_1000(&*t).await;
    assert_eq!(scalar(&db, kind, "SELECT COUNT(*) FROM {t}").await, 0);
}

async fn courier_dispatches_1000_and_php_consumes_them_all(kind: Kind, zone: &str) {
    let db = Db::new(kind);
    let tz: Tz = zone.parse().unwrap();
    let t = db.courier("default", tz).await;
    let offset = if zone == "UTC" { "+00:00" } else { "-04:00" };
    courier_sends(&*t, 1, 1000, offset).await;
    let headers = scalar(
        &db,
        kind,
        "SELECT COUNT(*) FROM {t} WHERE headers LIKE '%x-courier-stamp-priority%' AND headers NOT LIKE '%PriorityStamp%'",
    )
    .await;
    assert_eq!(headers, 1000, "Courier's own stamps are plain headers");
    php_consumes_courier_1000(&db.php("default"), zone, offset).await;
    assert_eq!(scalar(&db, kind, PENDING).await, 0);
}

async fn a_retry_crosses_from_php_to_courier_and_back_with_its_count(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    php_fails_20_once(&db.php("default")).await;

    // Courier fails each again: its worker retries it with RedeliveryStamp 2.
    courier_fails_php_retries_again(t.clone(), "default", retry_strategy()).await;

    php_reads_courier_retries(&db.php("default"), 2).await;
    assert_eq!(scalar(&db, kind, PENDING).await, 0);
}

async fn php_and_courier_workers_share_one_queue_with_none_lost_or_doubled(kind: Kind) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    php_and_courier_share_1000(&*t, db.php("default"), "10", async |_, _| {
        scalar(&db, kind, PENDING).await == 0
    })
    .await;
}

async fn a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason(
    kind: Kind,
) {
    let db = Db::new(kind);
    let t = db.courier("default", Tz::UTC).await;
    let failed = db.courier("failed", Tz::UTC).await;
    php_dispatches_unreadable(&db.php("default")).await;
    courier_moves_unreadable_to(t.clone(), "default", failed.clone(), 2).await;
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
    let (_, reasons) = failure_reasons(&*failed, 2).await;
    assert_unmapped_and_misfit(&reasons);
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
    acks_ride_on_the_next_claim;
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
