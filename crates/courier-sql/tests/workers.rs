//! The worker registry in `<table>_workers`: records survive between connections, heartbeats
//! carry counts and the stop flag, stale rows are pruned, and times come from the database.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::SqlHarness;
use courier_core::{Dsn, Heartbeat, Transport, WorkerRecord, WorkerRegistry};
use courier_sql::SqlTransport;

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the database answered within 30 s")
}

fn record(id: &str) -> WorkerRecord {
    WorkerRecord::new(id, "host-a", 42, vec!["async".into(), "low".into()])
}

fn registry(t: &SqlTransport) -> &dyn WorkerRegistry {
    t.abilities()
        .worker_registry
        .expect("a SQL transport has a worker registry")
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

async fn a_worker_registered_through_one_connection_is_listed_through_another(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    let b = h.reuse(&table).await;
    let before = now_ms();
    within(registry(&a).register(&record("w1"))).await.unwrap();
    let listed = within(registry(&b).list()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let w = &listed[0];
    assert_eq!(
        (w.id.as_str(), w.host.as_str(), w.pid),
        ("w1", "host-a", 42)
    );
    assert_eq!(w.transports, vec!["async".to_owned(), "low".to_owned()]);
    assert_eq!(w.version, env!("CARGO_PKG_VERSION"));
    assert!(!w.stop_requested);
    assert!(
        (before - 5_000..=now_ms() + 5_000).contains(&w.started_at_ms),
        "started_at is epoch ms from the database clock: {}",
        w.started_at_ms
    );
    assert_eq!(w.started_at_ms, w.last_heartbeat_ms);

    let mut counted = record("w1");
    counted.handled = 17;
    counted.failed = 2;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let beat = within(registry(&a).heartbeat(&counted)).await.unwrap();
    assert_eq!(beat, Heartbeat::new(false, false));
    let listed = within(registry(&b).list()).await.unwrap();
    assert_eq!((listed[0].handled, listed[0].failed), (17, 2));
    assert!(listed[0].last_heartbeat_ms > listed[0].started_at_ms);

    within(registry(&a).register(&record("w2"))).await.unwrap();
    let ids: Vec<String> = within(registry(&b).list())
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, ["w1", "w2"], "oldest first");
    within(registry(&b).unregister("w1")).await.unwrap();
    within(registry(&b).unregister("nobody")).await.unwrap();
    let ids: Vec<String> = within(registry(&a).list())
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, ["w2"]);
}

async fn a_stop_request_is_seen_by_the_next_heartbeat_and_cleared_by_registering(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    let b = h.reuse(&table).await;
    for id in ["w1", "w2", "w3"] {
        within(registry(&a).register(&record(id))).await.unwrap();
    }
    assert_eq!(
        within(registry(&b).request_stop(Some("w2"))).await.unwrap(),
        1
    );
    assert_eq!(
        within(registry(&b).request_stop(Some("w9"))).await.unwrap(),
        0
    );
    let w1 = within(registry(&a).heartbeat(&record("w1"))).await.unwrap();
    let w2 = within(registry(&a).heartbeat(&record("w2"))).await.unwrap();
    assert!(!w1.stop_requested && w2.stop_requested, "{w1:?} {w2:?}");
    let again = within(registry(&a).heartbeat(&record("w2"))).await.unwrap();
    assert!(again.stop_requested, "a heartbeat does not clear the flag");
    assert_eq!(within(registry(&b).request_stop(None)).await.unwrap(), 3);
    let w3 = within(registry(&a).heartbeat(&record("w3"))).await.unwrap();
    assert!(w3.stop_requested);
    within(registry(&a).register(&record("w3"))).await.unwrap();
    let w3 = within(registry(&a).heartbeat(&record("w3"))).await.unwrap();
    assert!(!w3.stop_requested, "registering anew clears it");
}

async fn stale_workers_are_pruned_and_not_asked_to_stop(h: &SqlHarness) {
    let (a, table) = h.make("&worker_stale_after=10s").await;
    assert_eq!(registry(&a).stale_after(), Duration::from_secs(10));
    within(registry(&a).register(&record("live")))
        .await
        .unwrap();
    within(registry(&a).register(&record("dead")))
        .await
        .unwrap();
    let workers = courier_sql::workers_table(&table);
    let aged = h
        .admin
        .exec(
            &format!("UPDATE {workers} SET last_heartbeat = last_heartbeat - 11000 WHERE id = ?"),
            &["dead"],
        )
        .await;
    assert_eq!(aged, 1);
    assert_eq!(
        within(registry(&a).request_stop(None)).await.unwrap(),
        1,
        "only the live one"
    );
    let ids: Vec<String> = within(registry(&a).list())
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, ["live"]);
    assert_eq!(
        h.admin.count(&workers).await,
        1,
        "the stale row was deleted"
    );
    let beat = within(registry(&a).heartbeat(&record("dead")))
        .await
        .unwrap();
    assert_eq!(
        beat,
        Heartbeat::new(false, true),
        "a late heartbeat registers it again"
    );
    assert_eq!(within(registry(&a).list()).await.unwrap().len(), 2);
}

async fn a_registry_alone_shares_the_table_of_the_transport(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    within(registry(&a).register(&record("w1"))).await.unwrap();
    let dsn = format!("{}?table_name={table}{}", h.base, h.extra);
    let dsn = Dsn::parse(&dsn).unwrap();
    let alone = within(SqlTransport::connect_worker_registry("runs", &dsn))
        .await
        .unwrap();
    let listed = within(alone.list()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(alone.location(), registry(&a).location(), "one store");
    assert!(
        alone
            .location()
            .is_some_and(|l| l.ends_with(&format!("#{}", courier_sql::workers_table(&table)))),
        "{:?}",
        alone.location()
    );
    assert_eq!(within(alone.request_stop(None)).await.unwrap(), 1);
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
    a_worker_registered_through_one_connection_is_listed_through_another,
    a_stop_request_is_seen_by_the_next_heartbeat_and_cleared_by_registering,
    stale_workers_are_pruned_and_not_asked_to_stop,
    a_registry_alone_shares_the_table_of_the_transport
);
