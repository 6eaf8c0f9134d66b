//! A Symfony failure transport (a Doctrine table's `failed` queue) seen from Courier: a real
//! Symfony Messenger 5.4 worker fails messages for good into it, Courier's `Listable` (what
//! `courier failed show / retry / remove` uses) lists and finds them with their class and
//! error, and a retry sends one back to the PHP queue, where PHP consumes it. The transports
//! come from a configuration (`symfony+...` DSNs, `[symfony.types]`), on SQLite, PostgreSQL
//! and MariaDB.
//!
//! Run with `--include-ignored` after `scripts/services` (PHP, PostgreSQL, MariaDB).

#![cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Db, Kind, SendEmail, consumed, php, registry};
use courier_core::TransportRegistry;
use courier_core::config::Config;
use courier_core::failed::{FailedMessage, retry_failed};
use courier_symfony::SymfonyTransportFactory;

const PHP_LIMIT: Duration = Duration::from_secs(120);

async fn php_failures_are_listed_with_class_and_error_and_a_retry_goes_back_to_php(kind: Kind) {
    let db = Db::new(kind);
    let dsn = |queue: &str| {
        format!(
            "symfony+{}?table_name={}&queue_name={queue}",
            db.url, db.table
        )
    };
    let config: Config = format!(
        "[transports.async]\ndsn = \"{}\"\nfailure_transport = \"failed\"\n\
         [transports.failed]\ndsn = \"{}\"\n\
         [symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n",
        dsn("default"),
        dsn("failed")
    )
    .parse()
    .unwrap();
    let factories = TransportRegistry::new().with(Arc::new(
        SymfonyTransportFactory::from_config(&config).unwrap(),
    ));
    let transports = tokio::time::timeout(
        Duration::from_secs(30),
        config.connect(&factories, registry()),
    )
    .await
    .expect("connect in time")
    .unwrap();

    // PHP stores whole seconds: the failed time (the row's `created_at`) is this or later.
    let before = std::time::SystemTime::now() - Duration::from_secs(1);
    php(
        "dispatch.php",
        &[&db.php("default"), "1", "3"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    let out = php(
        "fail.php",
        &[&db.php("default"), &db.php("failed"), "3", "30"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert_eq!(
        out.lines().filter(|l| l.starts_with('{')).count(),
        3,
        "{out}"
    );

    let failed = transports.get("failed").unwrap();
    let list = failed.as_listable().expect("a Symfony table is listable");
    let listed = list.list(10).await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    for (n, envelope) in (1..).zip(&listed) {
        let summary = FailedMessage::new("failed", envelope);
        assert_eq!(summary.kind, "mail.send", "{summary:?}");
        assert_eq!(summary.transport.as_deref(), Some("async"), "{summary:?}");
        assert_eq!(summary.error_class.as_deref(), Some("RuntimeException"));
        assert_eq!(
            summary.error.as_deref(),
            Some(format!("failed in PHP for good: {n}").as_str())
        );
        assert_eq!(envelope.message::<SendEmail>().map(|m| m.id), Some(n));
        // PHP's SentToFailureTransportStamp carries no time: the row's `created_at` says it.
        let failed_at = summary.failed_at.as_deref().expect("a failed time");
        let failed_at = humantime::parse_rfc3339(failed_at).unwrap();
        assert!(
            failed_at >= before && failed_at <= std::time::SystemTime::now(),
            "failed at {failed_at:?}, the test ran from {before:?}"
        );
    }
    assert_eq!(list.list(2).await.unwrap().len(), 2, "the limit holds");

    let id = listed[0].id().unwrap().to_owned();
    let found = list.find(&id).await.unwrap().expect("found by its row id");
    assert_eq!(
        FailedMessage::new("failed", &found).failed_at,
        FailedMessage::new("failed", &listed[0]).failed_at,
        "found and listed, it has one failed time"
    );
    assert_eq!(found.message::<SendEmail>().map(|m| m.id), Some(1));
    assert!(list.find("not-a-row").await.unwrap().is_none());
    assert!(list.find("999999999").await.unwrap().is_none());
    let other_queue = transports.get("async").unwrap().as_listable().unwrap();
    assert!(
        other_queue.find(&id).await.unwrap().is_none(),
        "a queue sees its own rows only"
    );

    // `courier failed retry`: back to the transport PHP failed it on, as new.
    retry_failed(&transports, list, found).await.unwrap();
    assert!(list.find(&id).await.unwrap().is_none(), "retried away");
    assert_eq!(list.list(10).await.unwrap().len(), 2);
    let out = php(
        "consume.php",
        &[&db.php("default"), "1", "20"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    let lines = consumed(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0].class, r"App\Message\SendEmail");
    assert_eq!(lines[0].id, Some(1));
    assert_eq!(lines[0].retry, 0, "retried as new");

    // `courier failed remove`.
    for envelope in list.list(10).await.unwrap() {
        assert!(list.remove(envelope.id().unwrap()).await.unwrap());
    }
    assert!(!list.remove(&id).await.unwrap(), "nothing left to remove");
    assert!(list.list(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php: run scripts/services"]
async fn sqlite_php_failures_are_listed_and_retried() {
    php_failures_are_listed_with_class_and_error_and_a_retry_goes_back_to_php(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and postgres: run scripts/services, set COURIER_TEST_POSTGRES_URL"]
async fn postgres_php_failures_are_listed_and_retried() {
    php_failures_are_listed_with_class_and_error_and_a_retry_goes_back_to_php(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and mysql: run scripts/services, set COURIER_TEST_MYSQL_URL"]
async fn mysql_php_failures_are_listed_and_retried() {
    php_failures_are_listed_with_class_and_error_and_a_retry_goes_back_to_php(Kind::Mysql).await;
}
