//! The application's own pool of 3 connections shared by a SQL transport
//! (`SqlTransport::from_pool`), a run store (`SqlRunStore::from_pool`) and the application's
//! own queries (a transaction that inserts a row and `dispatch_in`s a follow-up), under a real
//! worker at concurrency 8: everything handled, no deadlock, no pool exhaustion, and the pool
//! still open after the transport and the store are gone. A pool too small fails with a timeout
//! naming the shared pool, in bounded time.
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use courier_core::{
    Envelope, Message, MessageBus, MessageRegistry, Transport, TransportErrorKind, Worker,
};
use courier_runs::{NewRun, RunStore, SqlRunStore, SqlRunStoreOptions};
use courier_sql::{SqlOptions, SqlPool, SqlTransport, dispatch_in};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

/// Messages sent by the test; each handler writes an application row and dispatches a
/// [`Followed`] in the same transaction.
const N: u64 = 120;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    n: u64,
}
impl Message for Order {
    const NAME: &'static str = "app.order";
}

#[derive(Debug, Serialize, Deserialize)]
struct Followed {
    n: u64,
}
impl Message for Followed {
    const NAME: &'static str = "app.followed";
}

/// The application's statements, per dialect.
fn app_sql(pool: &SqlPool, table: &str) -> (String, String) {
    let create = format!("CREATE TABLE {table} (n BIGINT NOT NULL PRIMARY KEY)");
    let insert = match pool.dialect() {
        courier_sql::Dialect::Postgres => format!("INSERT INTO {table} (n) VALUES ($1)"),
        _ => format!("INSERT INTO {table} (n) VALUES (?)"),
    };
    (create, insert)
}

/// Runs the application's statement `sql` binding `n` (in `tx` when given).
macro_rules! exec {
    ($exec:expr, $sql:expr) => {
        sqlx::query($sql).execute($exec).await.map(drop)
    };
    ($exec:expr, $sql:expr, $n:expr) => {
        sqlx::query($sql)
            .bind(i64::try_from($n).unwrap())
            .execute($exec)
            .await
            .map(drop)
    };
}

/// An order's handler: one transaction of the shared pool inserts the application's row and
/// dispatches the follow-up; the run store is used after commit, never while the transaction
/// holds a connection (a handler holding one connection while waiting for another is how a
/// small pool deadlocks).
async fn handle_order(
    pool: SqlPool,
    bus: Arc<OnceLock<MessageBus>>,
    insert: Arc<str>,
    n: u64,
) -> Result<(), courier_core::BoxError> {
    let bus = bus.get().ok_or("bus not built")?;
    match &pool {
        SqlPool::Sqlite(p) => {
            let mut tx = p.begin().await?;
            exec!(&mut *tx, &insert, n)?;
            dispatch_in(bus, &mut tx, Followed { n }).await?;
            tx.commit().await?;
        }
        SqlPool::Postgres(p) => {
            let mut tx = p.begin().await?;
            exec!(&mut *tx, &insert, n)?;
            dispatch_in(bus, &mut tx, Followed { n }).await?;
            tx.commit().await?;
        }
        SqlPool::Mysql(p) => {
            let mut tx = p.begin().await?;
            exec!(&mut *tx, &insert, n)?;
            dispatch_in(bus, &mut tx, Followed { n }).await?;
            tx.commit().await?;
        }
        _ => return Err("unknown pool".into()),
    }
    Ok(())
}

async fn count(pool: &SqlPool, table: &str) -> i64 {
    let sql = format!("SELECT COUNT(*) FROM {table}");
    match pool {
        SqlPool::Sqlite(p) => sqlx::query_scalar(&sql).fetch_one(p).await.unwrap(),
        SqlPool::Postgres(p) => sqlx::query_scalar(&sql).fetch_one(p).await.unwrap(),
        SqlPool::Mysql(p) => sqlx::query_scalar(&sql).fetch_one(p).await.unwrap(),
        _ => unreachable!(),
    }
}

async fn execute(pool: &SqlPool, sql: &str) {
    match pool {
        SqlPool::Sqlite(p) => exec!(p, sql).unwrap(),
        SqlPool::Postgres(p) => exec!(p, sql).unwrap(),
        SqlPool::Mysql(p) => exec!(p, sql).unwrap(),
        _ => unreachable!(),
    }
}

async fn three_connections_serve_transport_store_and_application(pool: SqlPool, prefix: &str) {
    assert_eq!(pool.max_connections(), 3);
    let app_table = format!("{prefix}_orders");
    let (create, insert) = app_sql(&pool, &app_table);
    execute(&pool, &create).await;

    let registry = Arc::new(MessageRegistry::new().with::<Order>().with::<Followed>());
    let options = SqlOptions::default()
        .table_name(format!("{prefix}_messages"))
        .unwrap()
        .poll_window(Duration::from_millis(200));
    let transport = Arc::new(
        timeout(
            Duration::from_secs(30),
            SqlTransport::from_pool("async", pool.clone(), options, registry),
        )
        .await
        .unwrap()
        .unwrap(),
    );
    let store = SqlRunStore::from_pool(
        pool.clone(),
        SqlRunStoreOptions::default().table_prefix(prefix),
    )
    .unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);

    let bus_cell: Arc<OnceLock<MessageBus>> = Arc::default();
    let followed = Arc::new(AtomicU64::new(0));
    let insert: Arc<str> = Arc::from(insert);
    let (p, b, ins) = (pool.clone(), bus_cell.clone(), insert.clone());
    let (s, f) = (store.clone(), followed.clone());
    let bus = MessageBus::builder()
        .transport("async", transport.clone())
        .route("app.order", ["async"])
        .route("app.followed", ["async"])
        .handler_fn("order", move |m: Arc<Order>| {
            let (p, b, ins) = (p.clone(), b.clone(), ins.clone());
            async move {
                handle_order(p, b, ins, m.n)
                    .await
                    .map_err(|e| courier_core::HandlerError::recoverable(e.to_string(), None))
            }
        })
        .handler_fn("followed", move |m: Arc<Followed>| {
            let (s, f) = (s.clone(), f.clone());
            async move {
                s.insert_queued(&NewRun::new("follow", serde_json::json!({ "n": m.n })))
                    .await
                    .map_err(|e| courier_core::HandlerError::recoverable(e.to_string(), None))?;
                f.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        })
        .build();
    bus_cell.set(bus.clone()).unwrap();

    let orders: Vec<Envelope> = (0..N).map(|n| Envelope::new(Order { n })).collect();
    timeout(Duration::from_secs(30), transport.send_batch(orders))
        .await
        .unwrap()
        .unwrap();

    let shutdown = CancellationToken::new();
    let worker = Worker::builder(bus)
        .receiver("async", transport.clone())
        .concurrency(8)
        .fetch_size(16)
        .build();
    let run = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(90);
    while followed.load(Ordering::Relaxed) < N && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let stats = timeout(Duration::from_secs(30), run)
        .await
        .expect("the worker stops")
        .unwrap()
        .unwrap();
    assert_eq!(
        followed.load(Ordering::Relaxed),
        N,
        "every follow-up handled within 90 s on a pool of 3 (stats: {stats:?})"
    );
    assert_eq!(count(&pool, &app_table).await, i64::try_from(N).unwrap());
    let runs = store.list(None, 1_000).await.unwrap();
    assert_eq!(runs.len(), usize::try_from(N).unwrap());
    assert_eq!(
        transport
            .abilities()
            .message_count
            .unwrap()
            .message_count()
            .await
            .unwrap(),
        0,
        "nothing left in the queue"
    );

    // Courier never closes the application's pool.
    drop((transport, store));
    assert!(!pool.is_closed());
    assert_eq!(count(&pool, &app_table).await, i64::try_from(N).unwrap());
    execute(&pool, &format!("DROP TABLE {app_table}")).await;
}

/// A pool of 1 whose connection the application holds: a send fails, in bounded time, with a
/// timeout naming the shared pool.
async fn a_pool_too_small_times_out_naming_it(pool: SqlPool, prefix: &str) {
    let options = SqlOptions::default()
        .table_name(format!("{prefix}_small"))
        .unwrap();
    let transport = SqlTransport::from_pool(
        "small",
        pool.clone(),
        options,
        Arc::new(MessageRegistry::new().with::<Order>()),
    )
    .await
    .unwrap();
    let take = pool_connection(&pool).await;
    let started = Instant::now();
    let err = timeout(
        Duration::from_secs(60),
        transport.send(Envelope::new(Order { n: 1 })),
    )
    .await
    .expect("a send on an exhausted pool does not hang")
    .unwrap_err();
    let waited = started.elapsed();
    drop(take);
    let text = err.to_string();
    assert_eq!(err.kind(), TransportErrorKind::Timeout, "{text}");
    assert!(
        text.contains("transport `small`")
            && text.contains("shared")
            && text.contains("pool (max_connections 1, acquire_timeout 200ms)"),
        "{text}"
    );
    assert!(waited < Duration::from_secs(30), "{waited:?}");
}

/// Holds one connection of the pool.
async fn pool_connection(pool: &SqlPool) -> Box<dyn std::any::Any + Send> {
    match pool {
        SqlPool::Sqlite(p) => Box::new(p.acquire().await.unwrap()),
        SqlPool::Postgres(p) => Box::new(p.acquire().await.unwrap()),
        SqlPool::Mysql(p) => Box::new(p.acquire().await.unwrap()),
        _ => unreachable!(),
    }
}

async fn sqlite_pool(dir: &support::TempDir, max: u32, acquire: Duration) -> SqlPool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let connect = SqliteConnectOptions::new()
        .filename(dir.0.join("app.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        .connect_with(connect)
        .await
        .unwrap()
        .into()
}

async fn pg_pool(max: u32, acquire: Duration) -> SqlPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        .connect(&courier_test::env::postgres_url())
        .await
        .unwrap()
        .into()
}

async fn mysql_pool(max: u32, acquire: Duration) -> SqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        .connect(&courier_test::env::mysql_url())
        .await
        .unwrap()
        .into()
}

const ACQUIRE: Duration = Duration::from_secs(10);
const SMALL: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_pool_of_3_is_shared_under_8_handlers() {
    let dir = support::TempDir::new();
    let prefix = courier_test::env::unique_name("shared");
    let pool = sqlite_pool(&dir, 3, ACQUIRE).await;
    three_connections_serve_transport_store_and_application(pool, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_pool_of_3_is_shared_under_8_handlers() {
    let prefix = courier_test::env::unique_name("shared");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&courier_test::env::postgres_url(), &prefix);
    let pool = pg_pool(3, ACQUIRE).await;
    three_connections_serve_transport_store_and_application(pool, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs mariadb: set COURIER_TEST_MYSQL_URL"]
async fn mysql_pool_of_3_is_shared_under_8_handlers() {
    let prefix = courier_test::env::unique_name("shared");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&courier_test::env::mysql_url(), &prefix);
    let pool = mysql_pool(3, ACQUIRE).await;
    three_connections_serve_transport_store_and_application(pool, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_pool_too_small_times_out_naming_the_pool() {
    let dir = support::TempDir::new();
    let prefix = courier_test::env::unique_name("shared");
    let pool = sqlite_pool(&dir, 1, SMALL).await;
    a_pool_too_small_times_out_naming_it(pool, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_pool_too_small_times_out_naming_the_pool() {
    let prefix = courier_test::env::unique_name("shared");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&courier_test::env::postgres_url(), &prefix);
    let pool = pg_pool(1, SMALL).await;
    a_pool_too_small_times_out_naming_it(pool, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mariadb: set COURIER_TEST_MYSQL_URL"]
async fn mysql_pool_too_small_times_out_naming_the_pool() {
    let prefix = courier_test::env::unique_name("shared");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&courier_test::env::mysql_url(), &prefix);
    let pool = mysql_pool(1, SMALL).await;
    a_pool_too_small_times_out_naming_it(pool, &prefix).await;
}

/// PostgreSQL's `LISTEN` holds one connection of the pool while the transport lives, so a pool
/// of 1 never starts it: with `listen` on or off (`listen(false)`), the transport polls and the
/// pool's one connection serves the statements. (A listener started on a pool of 1 took that
/// connection for good, and every claim after it timed out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_a_pool_of_one_polls_whether_or_not_it_listens() {
    let prefix = courier_test::env::unique_name("shared");
    let cleanup = courier_test::Cleanup::new();
    cleanup.sql_tables(&courier_test::env::postgres_url(), &prefix);
    let registry = Arc::new(MessageRegistry::new().with::<Order>());
    for listen in [false, true] {
        let pool = pg_pool(1, SMALL).await;
        let options = SqlOptions::default()
            .table_name(format!("{prefix}_messages"))
            .unwrap()
            .poll_window(Duration::from_millis(300))
            .listen(listen);
        let transport = SqlTransport::from_pool("pg", pool.clone(), options, registry.clone())
            .await
            .unwrap();
        let first = timeout(Duration::from_secs(30), transport.get(1))
            .await
            .unwrap();
        assert!(first.unwrap().is_empty());
        timeout(
            Duration::from_secs(30),
            transport.send(Envelope::new(Order { n: 1 })),
        )
        .await
        .unwrap()
        .unwrap();
        let got = timeout(Duration::from_secs(30), transport.get(1))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 1);
        transport.ack(&got[0]).await.unwrap();
    }
}
