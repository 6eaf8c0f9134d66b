//! Several workers starting at once on a fresh database: every concurrent `setup` of one new
//! table (each with its own pool, as separate processes have) succeeds, on every dialect.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use futures_util::future::join_all;

const SETUPS: usize = 8;

async fn concurrent_setups_of_a_fresh_table_all_succeed(h: &common::SqlHarness) {
    let table = h.table("courier_race");
    let dsn = format!("{}?table_name={table}&poll_window=200ms{}", h.base, h.extra);
    let attempts = (0..SETUPS).map(|_| {
        let dsn = courier_core::Dsn::parse(&dsn).unwrap();
        async move {
            tokio::time::timeout(
                Duration::from_secs(60),
                courier_sql::SqlTransport::connect("test", &dsn, courier_test::registry()),
            )
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| {
                r.map(drop)
                    .map_err(|e| courier_core::error_chain(&e).to_string())
            })
        }
    });
    let results = join_all(attempts).await;
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {SETUPS} setups failed: {failed:?}",
        failed.len()
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_concurrent_setups_of_a_fresh_table_all_succeed() {
    concurrent_setups_of_a_fresh_table_all_succeed(&common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_concurrent_setups_of_a_fresh_table_all_succeed() {
    concurrent_setups_of_a_fresh_table_all_succeed(&common::postgres().await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_concurrent_setups_of_a_fresh_table_all_succeed() {
    concurrent_setups_of_a_fresh_table_all_succeed(&common::mysql().await).await;
}
