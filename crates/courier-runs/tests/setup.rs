//! The run store's `setup` on a fresh database: several workers starting at once (each with its
//! own pool, as separate processes have) all succeed, on every dialect; tables created by an
//! older migration are upgraded in place.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::time::Duration;

use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
use futures_util::future::join_all;

const SETUPS: usize = 8;

fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

async fn concurrent_setups_of_fresh_tables_all_succeed(dsn: &str) {
    let prefix = courier_test::env::unique_name("race");
    let options = SqlRunStoreOptions::default()
        .table_prefix(&prefix)
        .max_connections(2);
    let mut stores = Vec::new();
    for _ in 0..SETUPS {
        let store = tokio::time::timeout(
            Duration::from_secs(20),
            SqlRunStore::connect(dsn, options.clone()),
        )
        .await
        .expect("connect timed out")
        .expect("connect");
        stores.push(store);
    }
    let results = join_all(stores.iter().map(|s| async move {
        tokio::time::timeout(Duration::from_secs(60), s.setup())
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|e| chain(&e)))
    }))
    .await;
    let usable = stores[0].list(None, 1).await.map(|runs| runs.len());
    stores[0].drop_tables().await.expect("drop tables");
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {SETUPS} setups failed: {failed:?}",
        failed.len()
    );
    assert_eq!(usable.expect("tables usable after the race"), 0);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_setups_of_fresh_tables_all_succeed() {
    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}?mode=rwc", dir.0.join("runs.db").display());
    concurrent_setups_of_fresh_tables_all_succeed(&dsn).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_concurrent_setups_of_fresh_tables_all_succeed() {
    concurrent_setups_of_fresh_tables_all_succeed(&courier_test::env::postgres_url()).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_concurrent_setups_of_fresh_tables_all_succeed() {
    concurrent_setups_of_fresh_tables_all_succeed(&courier_test::env::mysql_url()).await;
}

/// Tables created by `0002_courier_runs.sql` alone (before `due_at`) are upgraded by `setup`:
/// the column is added, and a run queued before counts as due when it was last written.
async fn tables_from_the_previous_migration_are_upgraded(dsn: &str, migration: &str) {
    let prefix = courier_test::env::unique_name("upgrade");
    let options = SqlRunStoreOptions::default().table_prefix(&prefix);
    let store = tokio::time::timeout(Duration::from_secs(20), SqlRunStore::connect(dsn, options))
        .await
        .expect("connect timed out")
        .expect("connect");
    let sql = migration
        .replace("courier_run_events", store.events_table())
        .replace("courier_runs", store.runs_table());
    let body: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in body.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        store.execute(statement).await.expect("old migration");
    }
    let id = uuid::Uuid::new_v4();
    store
        .execute(&format!(
            "INSERT INTO {} (id, agent, status, input, lease_expires, requeue_count, created_at, updated_at) \
             VALUES ('{id}', 'scripted', 'queued', '{{}}', 0, 0, 1000, 2000)",
            store.runs_table()
        ))
        .await
        .expect("old row");
    let upgraded = async {
        store.setup().await.expect("setup upgrades");
        store
            .setup()
            .await
            .expect("setup is idempotent after the upgrade");
        let run = store.find(id).await.expect("find").expect("the old row");
        let overdue = store
            .select_overdue(Duration::from_secs(1), 10)
            .await
            .expect("overdue select");
        (run, overdue)
    }
    .await;
    store.drop_tables().await.expect("drop tables");
    let (run, overdue) = upgraded;
    assert_eq!(run.due_at, 2000, "due when last written");
    assert_eq!(overdue.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_tables_from_the_previous_migration_are_upgraded() {
    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}?mode=rwc", dir.0.join("runs.db").display());
    tables_from_the_previous_migration_are_upgraded(
        &dsn,
        include_str!("../migrations/sqlite/0002_courier_runs.sql"),
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tables_from_the_previous_migration_are_upgraded() {
    tables_from_the_previous_migration_are_upgraded(
        &courier_test::env::postgres_url(),
        include_str!("../migrations/postgres/0002_courier_runs.sql"),
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_tables_from_the_previous_migration_are_upgraded() {
    tables_from_the_previous_migration_are_upgraded(
        &courier_test::env::mysql_url(),
        include_str!("../migrations/mysql/0002_courier_runs.sql"),
    )
    .await;
}
