//! What the end-to-end tests share: a bound on every network await, DSNs with unique names on
//! the shared servers, and the removal of what a test created there, pass or fail.

#![allow(dead_code, reason = "each test file uses a part")]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier::amqp::AmqpTransport;
use courier::{Dsn, MessageRegistry};
use futures_util::FutureExt;
use sqlx::Connection;

/// The bound on one network operation (connect, setup, send, a CLI command).
pub(crate) const OP: Duration = Duration::from_secs(30);

/// Awaits `fut` for at most `limit`, panicking with `what` when it takes longer.
pub(crate) async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// `url` with `query` appended (`?` or `&`).
pub(crate) fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

/// Something a test created on a shared server.
enum Leftover {
    /// Every table whose name starts with the prefix, on PostgreSQL or MySQL / MariaDB.
    Tables { url: String, prefix: String },
    /// Every Redis key that starts with the prefix.
    RedisKeys { url: String, prefix: String },
    /// The exchange and queues of an AMQP DSN.
    Amqp { dsn: String },
    /// What this AMQP transport declared, its delay queues included.
    AmqpTransport(Arc<AmqpTransport>),
}

/// A test's names and temporary directory, and the server-side objects to remove at its end.
pub(crate) struct Scratch {
    /// A unique lowercase prefix for this test's tables, streams, exchanges and queues.
    pub(crate) prefix: String,
    /// A temporary directory (SQLite files, the CLI's configuration), removed on drop.
    pub(crate) dir: tempfile::TempDir,
    leftovers: Mutex<Vec<Leftover>>,
}

impl Scratch {
    pub(crate) fn new() -> Self {
        Self {
            prefix: courier_test::env::unique_name("e2e"),
            dir: tempfile::tempdir().expect("a temporary directory"),
            leftovers: Mutex::new(Vec::new()),
        }
    }

    fn leave(&self, leftover: Leftover) {
        self.leftovers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(leftover);
    }

    /// `prefix_suffix`.
    pub(crate) fn name(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix)
    }

    /// A SQLite file in the temporary directory.
    pub(crate) fn sqlite_url(&self, file: &str) -> String {
        format!("sqlite://{}", self.dir.path().join(file).display())
    }

    /// The SQL transport on a SQLite file, on queue `queue`.
    pub(crate) fn sqlite_dsn(&self, file: &str, queue: &str) -> String {
        with_query(
            &self.sqlite_url(file),
            &format!("queue_name={queue}&poll_window=100ms"),
        )
    }

    /// The SQL transport on PostgreSQL, in table `prefix_<table>` (dropped at the end).
    pub(crate) fn postgres_dsn(&self, table: &str) -> String {
        let url = courier_test::env::postgres_url();
        self.sql_tables(&url);
        with_query(
            &url,
            &format!("table_name={}&poll_window=100ms", self.name(table)),
        )
    }

    /// The SQL transport on MySQL / MariaDB, in table `prefix_<table>` (dropped at the end).
    pub(crate) fn mysql_dsn(&self, table: &str) -> String {
        let url = courier_test::env::mysql_url();
        self.sql_tables(&url);
        with_query(
            &url,
            &format!("table_name={}&poll_window=100ms", self.name(table)),
        )
    }

    /// Drops every table named `prefix...` on the server of `url` at the end (the run store's
    /// tables, created with this prefix, included).
    pub(crate) fn sql_tables(&self, url: &str) {
        self.leave(Leftover::Tables {
            url: url.to_owned(),
            prefix: self.prefix.clone(),
        });
    }

    /// The Redis transport on stream `prefix_<stream>` (its keys deleted at the end).
    pub(crate) fn redis_dsn(&self, stream: &str) -> String {
        let url = courier_test::env::redis_url();
        let stream = self.name(stream);
        self.leave(Leftover::RedisKeys {
            url: url.clone(),
            prefix: stream.clone(),
        });
        with_query(&url, &format!("stream={stream}&poll_window=100ms"))
    }

    /// The AMQP transport on exchange and queue `prefix_<name>` (deleted at the end).
    pub(crate) fn amqp_dsn(&self, name: &str) -> String {
        let name = self.name(name);
        let dsn = with_query(
            &courier_test::env::amqp_url(),
            &format!("exchange={name}&queues={name}&poll_window=100ms"),
        );
        self.leave(Leftover::Amqp { dsn: dsn.clone() });
        dsn
    }

    /// Deletes what `transport` declared at the end, the delay queues it made included (a fresh
    /// transport on the same DSN knows only the exchange and queues).
    pub(crate) fn amqp_transport(&self, transport: Arc<AmqpTransport>) {
        self.leave(Leftover::AmqpTransport(transport));
    }

    /// Runs `test`, then removes what it created whether it passed or panicked, then re-raises
    /// its panic.
    pub(crate) async fn run(&self, test: impl Future<Output = ()>) {
        let result = AssertUnwindSafe(test).catch_unwind().await;
        self.clean().await;
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }

    async fn clean(&self) {
        let leftovers = std::mem::take(
            &mut *self
                .leftovers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for leftover in leftovers {
            let outcome = match &leftover {
                Leftover::Tables { url, prefix } => {
                    tokio::time::timeout(OP, drop_tables(url, prefix)).await
                }
                Leftover::RedisKeys { url, prefix } => {
                    tokio::time::timeout(OP, delete_keys(url, prefix)).await
                }
                Leftover::Amqp { dsn } => tokio::time::timeout(OP, delete_topology(dsn)).await,
                Leftover::AmqpTransport(transport) => {
                    tokio::time::timeout(OP, async {
                        transport.delete_topology().await?;
                        transport.close().await;
                        Ok(())
                    })
                    .await
                }
            };
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("cleanup failed: {e}"),
                Err(_) => eprintln!("cleanup timed out"),
            }
        }
    }
}

type CleanResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn drop_tables(url: &str, prefix: &str) -> CleanResult {
    let pattern = format!("{prefix}%");
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name LIKE $1",
        )
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await?;
        for table in &tables {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table} CASCADE"))
                .execute(&mut conn)
                .await?;
        }
    } else {
        let mut conn = sqlx::MySqlConnection::connect(url).await?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name LIKE ?",
        )
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await?;
        for table in &tables {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&mut conn)
                .await?;
        }
    }
    Ok(())
}

async fn delete_keys(url: &str, prefix: &str) -> CleanResult {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        redis::cmd("DEL")
            .arg(&keys)
            .query_async::<()>(&mut conn)
            .await?;
    }
    Ok(())
}

async fn delete_topology(dsn: &str) -> CleanResult {
    let dsn = Dsn::parse(dsn)?;
    let transport =
        AmqpTransport::connect("cleanup", &dsn, Arc::new(MessageRegistry::new())).await?;
    transport.delete_topology().await?;
    transport.close().await;
    Ok(())
}
