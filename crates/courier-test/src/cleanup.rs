//! Removing what a test created on the shared test servers, whether it passed or panicked.
//!
//! A [`Cleanup`] is a drop guard: a test registers what it creates (tables by name prefix, Redis
//! keys by prefix, anything else as an async task) and the guard removes it when it drops, at
//! the end of the test or while a failing test unwinds. Declare it before the transports that
//! use what it removes, so that they are dropped (and stop using it) first:
//!
//! ```no_run
//! # #[cfg(feature = "sql")]
//! # async fn test() {
//! let cleanup = courier_test::Cleanup::new();
//! // `outage_<random>` (and `outage_<random>_migrations`, `_workers`, ...) on PostgreSQL:
//! let table = cleanup.postgres_table("outage");
//! let dsn = format!("{}?table_name={table}", courier_test::env::postgres_url());
//! // ... connect a transport on `dsn`, assert ...
//! # }
//! ```
//!
//! `scripts/leftovers`, run by `scripts/test` around the suite, fails when anything is left.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The bound on one removal (a connection and its statements).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

type Task = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// One thing to remove.
enum Item {
    /// Every table whose name starts with `prefix`, in the database of `url` (PostgreSQL or
    /// MySQL / MariaDB).
    #[cfg(feature = "sql")]
    SqlTables { url: String, prefix: String },
    /// Every Redis key that starts with `prefix`.
    #[cfg(feature = "redis")]
    RedisKeys { url: String, prefix: String },
    /// Anything else, as an async task; `what` names it in the error.
    Task { what: String, task: Task },
}

/// Removes what a test created on the shared servers when dropped (on success and on panic),
/// or when [`Cleanup::run`] is awaited. See the [module docs](self).
///
/// Removal failures are printed to stderr (a guard must not panic while a failing test
/// unwinds); `scripts/test` then fails on what is left.
#[derive(Default)]
pub struct Cleanup {
    items: Mutex<Vec<Item>>,
}

impl std::fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Cleanup")
            .field("pending", &items.len())
            .finish()
    }
}

impl Cleanup {
    /// A guard with nothing to remove yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `item`, unless the same tables or keys are registered already.
    fn push(&self, item: Item) {
        let mut items = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        let known = items.iter().any(|known| match (known, &item) {
            #[cfg(feature = "sql")]
            (
                Item::SqlTables { url, prefix },
                Item::SqlTables {
                    url: new_url,
                    prefix: new_prefix,
                },
            ) => url == new_url && prefix == new_prefix,
            #[cfg(feature = "redis")]
            (
                Item::RedisKeys { url, prefix },
                Item::RedisKeys {
                    url: new_url,
                    prefix: new_prefix,
                },
            ) => url == new_url && prefix == new_prefix,
            _ => false,
        });
        if !known {
            items.push(item);
        }
    }

    /// Drops every table whose name starts with `prefix` in the database of `url`
    /// (`postgres://` or `mysql://`): a message table `prefix...` and every table beside it
    /// (`_migrations`, `_workers`, `_dedup`, `_cursors`, `_schedules`, `_paused`, `_limits`,
    /// the run store's `_runs`, ...). A `sqlite:` URL is left alone (its file is the test's
    /// temporary directory's to remove), so a test may call this on any dialect.
    ///
    /// # Panics
    /// When `prefix` is not a lowercase identifier of at least 8 characters (a short prefix
    /// could name another test's tables, or a user's).
    #[cfg(feature = "sql")]
    pub fn sql_tables(&self, url: &str, prefix: &str) {
        check_prefix(prefix);
        if url.starts_with("sqlite") {
            return;
        }
        self.push(Item::SqlTables {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        });
    }

    /// A unique table name `prefix_<random>` on `COURIER_TEST_POSTGRES_URL`, dropped with its
    /// side tables (see [`Cleanup::sql_tables`]).
    #[cfg(feature = "sql")]
    #[must_use]
    pub fn postgres_table(&self, prefix: &str) -> String {
        let name = crate::env::unique_name(prefix);
        self.sql_tables(&crate::env::postgres_url(), &name);
        name
    }

    /// A unique table name `prefix_<random>` on `COURIER_TEST_MYSQL_URL`, dropped with its
    /// side tables (see [`Cleanup::sql_tables`]).
    #[cfg(feature = "sql")]
    #[must_use]
    pub fn mysql_table(&self, prefix: &str) -> String {
        let name = crate::env::unique_name(prefix);
        self.sql_tables(&crate::env::mysql_url(), &name);
        name
    }

    /// Deletes every key starting with `prefix` on the Redis server of `url`.
    ///
    /// # Panics
    /// When `prefix` does not start with a lowercase identifier of at least 8 characters (the
    /// rest may hold `:`, as in `<stream>:delayed`).
    #[cfg(feature = "redis")]
    pub fn redis_keys(&self, url: &str, prefix: &str) {
        check_prefix(prefix.split(':').next().unwrap_or_default());
        self.push(Item::RedisKeys {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
        });
    }

    /// A unique name `prefix_<random>` (a stream, a group) on `COURIER_TEST_REDIS_URL`: every
    /// key starting with it is deleted.
    #[cfg(feature = "redis")]
    #[must_use]
    pub fn redis_name(&self, prefix: &str) -> String {
        let name = crate::env::unique_name(prefix);
        self.redis_keys(&crate::env::redis_url(), &name);
        name
    }

    /// Runs `task` at cleanup (AMQP queues and exchanges, NATS streams, ...): it must make its
    /// own connections, as the test's runtime may be gone. `what` names it when it fails; it is
    /// bounded by [`CLEANUP_TIMEOUT`]. Tasks run in the order they were added, after nothing
    /// else in particular.
    pub fn defer<E: Display>(
        &self,
        what: impl Into<String>,
        task: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.push(Item::Task {
            what: what.into(),
            task: Box::pin(async move { task.await.map_err(|e| e.to_string()) }),
        });
    }

    /// Removes everything registered so far, now; returns what could not be removed (also
    /// printed to stderr).
    pub async fn run(&self) -> Vec<String> {
        let items = std::mem::take(&mut *self.items.lock().unwrap_or_else(PoisonError::into_inner));
        remove(items).await
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let items = std::mem::take(self.items.get_mut().unwrap_or_else(PoisonError::into_inner));
        if items.is_empty() {
            return;
        }
        crate::block_on_teardown(async move {
            remove(items).await;
        });
    }
}

#[allow(dead_code, reason = "only with the `sql` or `redis` feature")]
fn check_prefix(prefix: &str) {
    assert!(
        prefix.len() >= 8
            && prefix.starts_with(|c: char| c.is_ascii_lowercase())
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
        "cleanup prefix {prefix:?} must be a lowercase identifier of at least 8 characters \
         (use courier_test::env::unique_name)"
    );
}

async fn remove(items: Vec<Item>) -> Vec<String> {
    let mut failed = Vec::new();
    for item in items {
        let (what, outcome) = match item {
            #[cfg(feature = "sql")]
            Item::SqlTables { url, prefix } => (
                format!("the tables {prefix}*"),
                tokio::time::timeout(CLEANUP_TIMEOUT, drop_sql_tables(&url, &prefix)).await,
            ),
            #[cfg(feature = "redis")]
            Item::RedisKeys { url, prefix } => (
                format!("the Redis keys {prefix}*"),
                tokio::time::timeout(CLEANUP_TIMEOUT, delete_redis_keys(&url, &prefix)).await,
            ),
            Item::Task { what, task } => (what, tokio::time::timeout(CLEANUP_TIMEOUT, task).await),
        };
        let error = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => format!("cleanup: removing {what} failed: {e}"),
            Err(_) => format!("cleanup: removing {what} took over {CLEANUP_TIMEOUT:?}"),
        };
        eprintln!("{error}");
        failed.push(error);
    }
    failed
}

/// `prefix` as a `LIKE` pattern matching every name that starts with it.
#[cfg(feature = "sql")]
fn like_prefix(prefix: &str) -> String {
    format!("{}%", prefix.replace('\\', "\\\\").replace('_', "\\_"))
}

/// Drops every table whose name starts with `prefix` in the current schema / database of `url`
/// (`postgres://...` or `mysql://...`), with a connection of its own. Waits at most 20 s for a
/// table's locks.
///
/// # Errors
/// When connecting or a statement fails (the message never contains the URL).
#[cfg(feature = "sql")]
pub async fn drop_sql_tables(url: &str, prefix: &str) -> Result<(), String> {
    use sqlx::Connection;

    let pattern = like_prefix(prefix);
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| format!("connecting to PostgreSQL: {e}"))?;
        sqlx::query("SET lock_timeout = '20s'")
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables \
             WHERE schemaname = current_schema() AND tablename LIKE $1",
        )
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("listing tables: {e}"))?;
        for table in tables {
            let quoted = format!("\"{}\"", table.replace('"', "\"\""));
            sqlx::query(&format!("DROP TABLE IF EXISTS {quoted} CASCADE"))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("dropping {table}: {e}"))?;
        }
        let _ = conn.close().await;
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(|e| format!("connecting to MySQL / MariaDB: {e}"))?;
        sqlx::query("SET SESSION lock_wait_timeout = 20")
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name LIKE ?",
        )
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("listing tables: {e}"))?;
        for table in tables {
            let quoted = format!("`{}`", table.replace('`', "``"));
            sqlx::query(&format!("DROP TABLE IF EXISTS {quoted}"))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("dropping {table}: {e}"))?;
        }
        let _ = conn.close().await;
    } else {
        return Err("not a postgres:// or mysql:// URL".to_owned());
    }
    Ok(())
}

/// Deletes every key starting with `prefix` on the Redis server of `url` (`SCAN`, then `DEL`),
/// with a connection of its own.
///
/// # Errors
/// When connecting or a command fails (the message never contains the URL).
#[cfg(feature = "redis")]
pub async fn delete_redis_keys(url: &str, prefix: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| format!("the Redis URL: {e}"))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to Redis: {e}"))?;
    // A glob matching names that start with `prefix` (glob characters escaped).
    let mut pattern = String::new();
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    let mut cursor: u64 = 0;
    let mut keys: Vec<String> = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("SCAN: {e}"))?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    for chunk in keys.chunks(500) {
        redis::cmd("DEL")
            .arg(chunk)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| format!("DEL: {e}"))?;
    }
    Ok(())
}
