//! The run store's `setup` on a fresh database: several workers starting at once (each with its
//! own pool, as separate processes have) all succeed, on every dialect; tables created by an
//! older migration are upgraded in place.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::time::Duration;

use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
use futures_util::future::join_all;

const SETUPS: usize = 8;

async fn concurrent_setups_of_fresh_tables_all_succeed(dsn: &str) {
    let prefix = courier_test::env::unique_name("race");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(dsn, &prefix);
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
            .and_then(|r| r.map_err(|e| courier_core::error_chain(&e).to_string()))
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

/// Tables created by a previous release (its migration files run by `.replace()`, no version
/// table) are upgraded by `setup`: what is in place is recorded, the rest applied, and the data
/// survives. `files` are the templates the previous release ran; `adds_due_at`: whether it had no
/// `due_at` yet.
async fn tables_from_a_previous_release_are_upgraded(dsn: &str, files: &[&str], adds_due_at: bool) {
    let prefix = courier_test::env::unique_name("upgrade");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(dsn, &prefix);
    let options = SqlRunStoreOptions::default().table_prefix(&prefix);
    let store = tokio::time::timeout(Duration::from_secs(20), SqlRunStore::connect(dsn, options))
        .await
        .expect("connect timed out")
        .expect("connect");
    let tables = [
        ("{runs}", store.runs_table()),
        ("{events}", store.events_table()),
    ];
    for file in files {
        let sql = courier_sql::migrate::render(file, &tables);
        let body: String = sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for statement in body.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            store.execute(statement).await.expect("old migration");
        }
    }
    let id = uuid::Uuid::new_v4();
    store
        .execute(&format!(
            "INSERT INTO {} (id, agent, status, input, lease_expires, requeue_count, created_at, updated_at) \
             VALUES ('{id}', 'scripted', 'queued', '{{\"n\": 7}}', 0, 0, 1000, 2000)",
            store.runs_table()
        ))
        .await
        .expect("old row");
    if !adds_due_at {
        // That release wrote due_at itself.
        let due = format!(
            "UPDATE {} SET due_at = 2000 WHERE id = '{id}'",
            store.runs_table()
        );
        store.execute(&due).await.expect("old due_at");
    }
    store
        .execute(&format!(
            "INSERT INTO {} (run_id, seq, kind, payload, created_at) VALUES ('{id}', 1, 'step', '[1, 2]', 1500)",
            store.events_table()
        ))
        .await
        .expect("old event");
    let upgraded = async {
        let applied = store.migrate().await.expect("setup upgrades");
        let again = store.migrate().await.expect("setup again");
        let run = store.find(id).await.expect("find").expect("the old row");
        let events = store.events(id).await.expect("events");
        let overdue = store
            .select_overdue(Duration::from_secs(1), 10)
            .await
            .expect("overdue select");
        let next = store
            .append_event(id, "step", &serde_json::json!({"after": true}))
            .await
            .expect("append after the upgrade");
        (applied, again, run, events, overdue, next)
    }
    .await;
    store.drop_tables().await.expect("drop tables");
    let (applied, again, run, events, overdue, next) = upgraded;
    let recorded: Vec<i64> = applied.iter().map(|a| a.version).collect();
    assert_eq!(
        recorded,
        [2, 3, 4, 5, 8, 10, 13, 14],
        "every version recorded: {applied:?}"
    );
    let due_at_ran = applied.iter().any(|a| a.version == 3 && a.ran);
    assert_eq!(
        due_at_ran, adds_due_at,
        "0003 runs only where due_at is missing: {applied:?}"
    );
    let native_ran = applied.iter().any(|a| a.version == 4 && a.ran);
    assert_eq!(
        native_ran,
        store.dialect() == courier_runs::Dialect::Postgres,
        "0004 is PostgreSQL's: {applied:?}"
    );
    assert!(again.is_empty(), "nothing left to apply: {again:?}");
    assert_eq!(run.input, serde_json::json!({"n": 7}), "input survives");
    assert_eq!(run.due_at, 2000, "due when last written");
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].payload,
        serde_json::json!([1, 2]),
        "payload survives"
    );
    assert_eq!(next, 2);
    assert_eq!(overdue.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
}

/// The files of the release before due_at, and of the one after (yesterday's), per dialect.
macro_rules! previous_releases {
    ($dialect:literal) => {
        (
            [include_str!(concat!(
                "../migrations/runs/",
                $dialect,
                "/0002_courier_runs.sql"
            ))],
            [
                include_str!(concat!(
                    "../migrations/runs/",
                    $dialect,
                    "/0002_courier_runs.sql"
                )),
                include_str!(concat!(
                    "../migrations/runs/",
                    $dialect,
                    "/0003_courier_runs_due_at.sql"
                )),
            ],
        )
    };
}

async fn both_previous_releases_are_upgraded(
    dsn: &str,
    (before_due_at, with_due_at): ([&str; 1], [&str; 2]),
) {
    tables_from_a_previous_release_are_upgraded(dsn, &before_due_at, true).await;
    tables_from_a_previous_release_are_upgraded(dsn, &with_due_at, false).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_tables_from_a_previous_release_are_upgraded() {
    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}", dir.0.join("runs.db").display());
    both_previous_releases_are_upgraded(&dsn, previous_releases!("sqlite")).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tables_from_a_previous_release_are_upgraded() {
    both_previous_releases_are_upgraded(
        &courier_test::env::postgres_url(),
        previous_releases!("postgres"),
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_tables_from_a_previous_release_are_upgraded() {
    both_previous_releases_are_upgraded(
        &courier_test::env::mysql_url(),
        previous_releases!("mysql"),
    )
    .await;
}
