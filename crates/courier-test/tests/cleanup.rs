//! `Cleanup` removes what a test registered on the real servers, when the test passes and when
//! it panics, on either runtime flavour, and nothing else: a table or key that only shares the
//! first letters of the prefix's stem survives.

#![cfg(all(feature = "sql", feature = "redis"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::time::Duration;

use courier_test::Cleanup;
use courier_test::env::{mysql_url, postgres_url, redis_url, unique_name};
use sqlx::Connection;

/// Runs `body` on a fresh runtime (multi-threaded or not) in its own thread and returns whether it
/// panicked (the panic is the test's failure the guard must clean up after).
fn run_in_thread<F, Fut>(multi_thread: bool, body: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        let rt = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        rt.block_on(body());
    })
    .join()
    .is_err()
}

async fn pg_tables(prefix: &str) -> Vec<String> {
    let mut conn = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() \
         AND starts_with(tablename, $1)",
    )
    .bind(prefix)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    names.sort();
    names
}

async fn pg_exec(sql: &str) {
    let mut conn = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::query(sql).execute(&mut conn).await.unwrap();
}

async fn mysql_tables(prefix: &str) -> Vec<String> {
    let mut conn = sqlx::MySqlConnection::connect(&mysql_url()).await.unwrap();
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND LEFT(table_name, CHAR_LENGTH(?)) = ?",
    )
    .bind(prefix)
    .bind(prefix)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    names.sort();
    names
}

async fn mysql_exec(sql: &str) {
    let mut conn = sqlx::MySqlConnection::connect(&mysql_url()).await.unwrap();
    sqlx::query(sql).execute(&mut conn).await.unwrap();
}

async fn redis_conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn redis_keys(prefix: &str) -> Vec<String> {
    let mut conn = redis_conn().await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// The message table `<stem>_messages` and its side tables, as the SQL transport names them.
fn tables(stem: &str) -> [String; 4] {
    [
        format!("{stem}_messages"),
        format!("{stem}_migrations"),
        format!("{stem}_workers"),
        format!("{stem}_dedup_migrations"),
    ]
}

async fn guard_drops_postgres_tables(multi_thread: bool, fail: bool) {
    let stem = unique_name("cleanup_pg");
    // `_` is a LIKE wildcard: `cleanupxpg_<random>_messages` must survive the prefix
    // `cleanup_pg_<random>`.
    let bystander = format!("{}_messages", stem.replacen('_', "x", 1));
    pg_exec(&format!("CREATE TABLE {bystander} (id INT)")).await;
    let inner = stem.clone();
    let panicked = run_in_thread(multi_thread, move || async move {
        let cleanup = Cleanup::new();
        cleanup.sql_tables(&postgres_url(), &inner);
        for t in tables(&inner) {
            pg_exec(&format!("CREATE TABLE {t} (id INT)")).await;
        }
        assert_eq!(pg_tables(&inner).await.len(), 4, "created");
        assert!(!fail, "the test fails after creating its tables");
    });
    assert_eq!(panicked, fail);
    let left = pg_tables(&stem).await;
    let bystander_left = pg_tables(&bystander).await;
    pg_exec(&format!("DROP TABLE IF EXISTS {bystander}")).await;
    assert_eq!(left, Vec::<String>::new(), "tables left behind");
    assert_eq!(
        bystander_left,
        [bystander],
        "a table beside the prefix survives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tables_are_dropped_when_a_test_panics_on_a_current_thread_runtime() {
    guard_drops_postgres_tables(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tables_are_dropped_when_a_test_panics_on_a_multi_thread_runtime() {
    guard_drops_postgres_tables(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tables_are_dropped_when_a_test_passes() {
    guard_drops_postgres_tables(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL / MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_tables_are_dropped_when_a_test_panics() {
    let stem = unique_name("cleanup_my");
    let bystander = format!("{}_messages", stem.replacen('_', "x", 1));
    mysql_exec(&format!("CREATE TABLE {bystander} (id INT)")).await;
    let inner = stem.clone();
    let panicked = run_in_thread(false, move || async move {
        let cleanup = Cleanup::new();
        let url = mysql_url();
        cleanup.sql_tables(&url, &inner);
        for t in tables(&inner) {
            mysql_exec(&format!("CREATE TABLE {t} (id INT)")).await;
        }
        assert_eq!(mysql_tables(&inner).await.len(), 4, "created");
        panic!("the test fails after creating its tables");
    });
    assert!(panicked);
    let left = mysql_tables(&stem).await;
    let bystander_left = mysql_tables(&bystander).await;
    mysql_exec(&format!("DROP TABLE IF EXISTS {bystander}")).await;
    assert_eq!(left, Vec::<String>::new(), "tables left behind");
    assert_eq!(
        bystander_left,
        [bystander],
        "a table beside the prefix survives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis: set COURIER_TEST_REDIS_URL"]
async fn redis_keys_are_deleted_when_a_test_panics() {
    let stem = unique_name("cleanup_redis");
    let bystander = stem.replacen('_', "x", 1);
    let mut conn = redis_conn().await;
    redis::cmd("SET")
        .arg(&bystander)
        .arg("1")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let inner = stem.clone();
    let panicked = run_in_thread(false, move || async move {
        let cleanup = Cleanup::new();
        cleanup.redis_keys(&redis_url(), &inner);
        let mut conn = redis_conn().await;
        // More keys than one SCAN page.
        for i in 0..1500 {
            redis::cmd("SET")
                .arg(format!("{inner}:{i}"))
                .arg("1")
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
        }
        redis::cmd("XADD")
            .arg(&inner)
            .arg("*")
            .arg("f")
            .arg("v")
            .query_async::<String>(&mut conn)
            .await
            .unwrap();
        panic!("the test fails after creating its keys");
    });
    assert!(panicked);
    let left = redis_keys(&stem).await;
    let bystander_left = redis_keys(&bystander).await;
    redis::cmd("DEL")
        .arg(&bystander)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        left.len(),
        0,
        "keys left behind: {:?}",
        &left[..left.len().min(5)]
    );
    assert_eq!(
        bystander_left,
        [bystander],
        "a key beside the prefix survives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_tasks_run_on_drop_and_failures_are_reported_not_raised() {
    let (tx, rx) = std::sync::mpsc::channel();
    let panicked = run_in_thread(false, move || async move {
        let cleanup = Cleanup::new();
        cleanup.defer("the first", async move {
            tx.send("ran").unwrap();
            Ok::<(), String>(())
        });
        cleanup.defer("the second", async { Err::<(), _>("refused") });
        let later = Cleanup::new();
        later.defer("a slow one", async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<(), _>("gone")
        });
        let failed = later.run().await;
        assert_eq!(failed, ["cleanup: removing a slow one failed: gone"]);
        assert!(later.run().await.is_empty(), "run empties the guard");
    });
    assert!(!panicked, "a failing removal does not panic");
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok("ran"));
}

#[test]
#[should_panic(expected = "must be a lowercase identifier of at least 8 characters")]
fn a_short_prefix_is_refused() {
    Cleanup::new().sql_tables("postgres://127.0.0.1/test", "courier");
}
