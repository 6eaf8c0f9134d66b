//! `setup`: the run tables and their upgrades, serialised across processes so that several
//! workers starting at once on a fresh database do not race in `CREATE TABLE IF NOT EXISTS`
//! (PostgreSQL reports such a race as a duplicate key in `pg_type` or `pg_class`).
//!
//! Under the lock: `0002_courier_runs.sql` (idempotent), then `0003_courier_runs_due_at.sql`
//! when the runs table has no `due_at` column yet (tables created before it are upgraded in
//! place). The lock is a transaction-scoped advisory lock on PostgreSQL, a named `GET_LOCK` on
//! MySQL/MariaDB (DDL commits implicitly there, so the lock is held by the session and released
//! at the end), and `BEGIN IMMEDIATE` (the write lock, waiting up to the busy timeout) on SQLite.

use sqlx::AnyConnection;
use sqlx::pool::PoolConnection;
use sqlx::{Any, Connection as _, Row as _};

use super::{Dialect, SqlRunStore, StoreError, db};

const SQLITE_DUE_AT: &str = include_str!("../../../migrations/sqlite/0003_courier_runs_due_at.sql");
const POSTGRES_DUE_AT: &str =
    include_str!("../../../migrations/postgres/0003_courier_runs_due_at.sql");
const MYSQL_DUE_AT: &str = include_str!("../../../migrations/mysql/0003_courier_runs_due_at.sql");

/// How long a MySQL setup waits for another process's setup, in seconds.
const MYSQL_LOCK_WAIT_S: i64 = 60;

impl Dialect {
    fn due_at_migration(self) -> &'static str {
        match self {
            Self::Sqlite => SQLITE_DUE_AT,
            Self::Postgres => POSTGRES_DUE_AT,
            Self::Mysql => MYSQL_DUE_AT,
        }
    }
}

impl SqlRunStore {
    /// The statements of a migration file for this store's table names, comments dropped.
    fn statements(&self, migration: &str) -> Vec<String> {
        let sql = migration
            .replace("courier_run_events", &self.options.events_table)
            .replace("courier_runs", &self.options.runs_table);
        let body: String = sql
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        body.split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Creates or upgrades the tables, holding the dialect's setup lock.
    pub(super) async fn locked_setup(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await.map_err(db("setup"))?;
        let lock_name = format!("courier_setup:{}", self.options.runs_table);
        let (begin, end, abort) = match self.dialect {
            Dialect::Postgres => ("BEGIN", "COMMIT", "ROLLBACK"),
            Dialect::Sqlite => ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"),
            Dialect::Mysql => ("", "", ""),
        };
        if self.dialect == Dialect::Mysql {
            let got: i64 = sqlx::query("SELECT CAST(COALESCE(GET_LOCK(?, ?), 0) AS SIGNED) AS got")
                .bind(&lock_name)
                .bind(MYSQL_LOCK_WAIT_S)
                .fetch_one(&mut *conn)
                .await
                .map_err(db("setup lock"))?
                .try_get("got")
                .map_err(db("setup lock"))?;
            if got != 1 {
                return Err(StoreError::Corrupt(format!(
                    "another setup of `{}` held its lock for more than {MYSQL_LOCK_WAIT_S}s",
                    self.options.runs_table
                )));
            }
            let result = self.migrate(&mut conn).await;
            let released = sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(&lock_name)
                .execute(&mut *conn)
                .await;
            if released.is_err() {
                // Never hand a session still holding the lock back to the pool.
                let _ = conn.detach().close().await;
            }
            return result;
        }
        sqlx::query(begin)
            .execute(&mut *conn)
            .await
            .map_err(db("setup"))?;
        let mut result = Ok(());
        if self.dialect == Dialect::Postgres {
            // `hashtext` gives the lock key; the lock is released at COMMIT or ROLLBACK.
            result = sqlx::query(
                "SELECT COUNT(*) AS n FROM (SELECT pg_advisory_xact_lock(hashtext($1))) AS l",
            )
            .bind(&lock_name)
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(db("setup lock"));
        }
        if result.is_ok() {
            result = self.migrate(&mut conn).await;
        }
        let finish = if result.is_ok() { end } else { abort };
        match sqlx::query(finish).execute(&mut *conn).await {
            Ok(_) => result,
            Err(e) => {
                // A connection left inside a transaction must not go back to the pool.
                let _ = conn.detach().close().await;
                result.and(Err(db("setup commit")(e)))
            }
        }
    }

    async fn migrate(&self, conn: &mut PoolConnection<Any>) -> Result<(), StoreError> {
        for statement in self.statements(self.dialect.migration()) {
            sqlx::query(&statement)
                .execute(&mut **conn)
                .await
                .map_err(db("setup"))?;
        }
        if !self.has_due_at(conn).await? {
            for statement in self.statements(self.dialect.due_at_migration()) {
                sqlx::query(&statement)
                    .execute(&mut **conn)
                    .await
                    .map_err(db("setup: add due_at"))?;
            }
        }
        Ok(())
    }

    async fn has_due_at(&self, conn: &mut AnyConnection) -> Result<bool, StoreError> {
        let table = &self.options.runs_table;
        let sql = match self.dialect {
            Dialect::Sqlite => {
                format!(
                    "SELECT COUNT(*) AS n FROM pragma_table_info('{table}') WHERE name = 'due_at'"
                )
            }
            Dialect::Postgres => format!(
                "SELECT COUNT(*) AS n FROM information_schema.columns WHERE table_schema = current_schema() \
                 AND table_name = lower('{table}') AND column_name = 'due_at'"
            ),
            Dialect::Mysql => format!(
                "SELECT COUNT(*) AS n FROM information_schema.columns WHERE table_schema = DATABASE() \
                 AND table_name = '{table}' AND column_name = 'due_at'"
            ),
        };
        let n: i64 = sqlx::query(&sql)
            .fetch_one(conn)
            .await
            .map_err(db("setup: find due_at"))?
            .try_get("n")
            .map_err(db("setup: find due_at"))?;
        Ok(n > 0)
    }
}
