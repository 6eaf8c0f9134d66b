//! The application's own pool: [`SqlPool`], what [`SqlTransport::from_pool`] and the SQL run
//! store's `from_pool` take, so that Courier's statements and the application's share one
//! connection budget (and [`dispatch_in`](crate::dispatch_in) runs on a transaction of that same
//! pool).
//!
//! A pool handed over is the application's: Courier never closes it (dropping a transport or a
//! store drops a handle, the pool stays open for the application), and never changes how its
//! connections are set up. What that means per database:
//!
//! - PostgreSQL: consumers waiting for messages are woken by `LISTEN`, which holds **one
//!   connection of the pool** for as long as the transport lives: count it when sizing the
//!   pool, or turn it off with [`SqlOptions::listen`] (`false`: consumers poll with an adaptive
//!   backoff, 5 ms doubling to 250 ms, and the transport takes no connection it does not give
//!   back). Courier's own pools also plan with `enable_sort = off`; the application's keeps its
//!   settings.
//! - MySQL / MariaDB: Courier's own pools run READ COMMITTED in UTC; the application's keeps its
//!   isolation level (a deadlock caused by REPEATABLE READ's gap locks is retried) and its time
//!   zone (the database clock is read as `UNIX_TIMESTAMP(NOW(3))`, which is right in any zone).
//! - SQLite: this process's writes take turns on the pool (a file's own pools keep two
//!   connections apart for them), and SQLite checkpoints its WAL itself.
//!
//! A pool too small for the load does not hang: an operation that finds no free connection
//! within the pool's `acquire_timeout` is retried a few times, then fails with a
//! [`TransportErrorKind::Timeout`](courier_core::TransportErrorKind::Timeout) error that names
//! the transport and the shared pool, its size and its timeout.

use std::time::Duration;

use crate::Dialect;

/// A sqlx pool opened by the application, on one of the databases Courier supports. Built with
/// `From` from a [`sqlx::SqlitePool`], [`sqlx::PgPool`] or [`sqlx::MySqlPool`] (the matching
/// crate feature on). Cloning it clones the handle.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SqlPool {
    /// A SQLite pool.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// A PostgreSQL pool.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// A MySQL / MariaDB pool.
    #[cfg(feature = "mysql")]
    Mysql(sqlx::MySqlPool),
}

#[cfg(feature = "sqlite")]
impl From<sqlx::SqlitePool> for SqlPool {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Self::Sqlite(pool)
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for SqlPool {
    fn from(pool: sqlx::PgPool) -> Self {
        Self::Postgres(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for SqlPool {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Self::Mysql(pool)
    }
}

impl SqlPool {
    /// The dialect of its database.
    #[must_use]
    pub fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => Dialect::Mysql,
            // No database feature: no pool can exist.
            #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
            _ => match *self {},
        }
    }

    /// The most connections it opens.
    #[must_use]
    pub fn max_connections(&self) -> u32 {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(p) => p.options().get_max_connections(),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.options().get_max_connections(),
            #[cfg(feature = "mysql")]
            Self::Mysql(p) => p.options().get_max_connections(),
            // No database feature: no pool can exist.
            #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
            _ => match *self {},
        }
    }

    /// How long an operation waits for one of its connections.
    #[must_use]
    pub fn acquire_timeout(&self) -> Duration {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(p) => p.options().get_acquire_timeout(),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.options().get_acquire_timeout(),
            #[cfg(feature = "mysql")]
            Self::Mysql(p) => p.options().get_acquire_timeout(),
            // No database feature: no pool can exist.
            #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
            _ => match *self {},
        }
    }

    /// Whether it was closed (by the application: Courier never closes it).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(p) => p.is_closed(),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => p.is_closed(),
            #[cfg(feature = "mysql")]
            Self::Mysql(p) => p.is_closed(),
            // No database feature: no pool can exist.
            #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
            _ => match *self {},
        }
    }

    /// A scheme for the dialect (where a DSN is shown: `courier workers`, `Debug`).
    pub(crate) fn scheme(&self) -> &'static str {
        match self.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
        }
    }

    /// How errors name it: `the shared PostgreSQL pool (max_connections 3, acquire_timeout
    /// 500ms)`.
    pub(crate) fn describe(&self) -> String {
        let db = match self.dialect() {
            Dialect::Sqlite => "SQLite",
            Dialect::Postgres => "PostgreSQL",
            Dialect::Mysql => "MySQL",
        };
        format!(
            "the shared {db} pool (max_connections {}, acquire_timeout {:?})",
            self.max_connections(),
            self.acquire_timeout()
        )
    }
}
