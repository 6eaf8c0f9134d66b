//! The raw side of `courier bench --runs`: a plain sqlx loop doing the durable-run state machine
//! with the same guarantees as the run store and its queue, on tables of its own in the same
//! database, without the framework (no bus, no worker, no runtime, no agent).
//!
//! - **Submit**, one run at a time: one transaction inserting the run row (`queued`) and its
//!   message.
//! - **Execute**, `workers x concurrency` tasks, each looping:
//!   1. claim one message under a lease (`UPDATE ... WHERE id = (SELECT ... LIMIT 1 [FOR UPDATE
//!      SKIP LOCKED]) RETURNING`; MySQL: `SELECT ... FOR UPDATE SKIP LOCKED` then `UPDATE`, in a
//!      transaction);
//!   2. the guarded claim of its run (`queued` -> `running`, owner and lease);
//!   3. per step, one transaction: the lease renewal guarded by status and owner (refused: the
//!      run is lost) and the insert of the step's row;
//!   4. the guarded settle (`running` by this owner -> `succeeded` with its output);
//!   5. the delete of the message, guarded by its delivery.
//!
//! SQLite has one writer: the raw side's pool holds one connection, so its writes queue in the
//! pool instead of in SQLite's busy handler (the run store takes turns on a lock for the same
//! reason).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier_sql::{Dialect, PoolSettings};

use crate::error::{RawError, RawResult, chain};

/// Statements and round trips per run of each phase, for a run of `steps` steps.
#[derive(Debug, Clone, Copy)]
pub struct RawCost {
    /// Statements per run of the submit phase.
    pub submit_statements: f64,
    /// Statements per run of the execute phase.
    pub execute_statements: f64,
    /// Round trips per run, both phases.
    pub round_trips: f64,
}

impl RawCost {
    fn of(dialect: Dialect, steps: u64) -> Self {
        let steps = steps as f64;
        // A message claim: one statement, or (MySQL) BEGIN, SELECT, UPDATE, COMMIT.
        let (claim_statements, claim_trips) = if dialect == Dialect::Mysql {
            (2.0, 4.0)
        } else {
            (1.0, 1.0)
        };
        Self {
            // BEGIN, two inserts, COMMIT.
            submit_statements: 2.0,
            // The message claim, the run claim, per step a renew and an insert, settle, delete.
            execute_statements: claim_statements + 1.0 + 2.0 * steps + 2.0,
            round_trips: 4.0 + claim_trips + 1.0 + 4.0 * steps + 2.0,
        }
    }
}

fn failed(what: &str) -> impl FnOnce(sqlx::Error) -> RawError + '_ {
    move |e| RawError::failed(format!("raw runs loop: {what}: {}", chain(&e)))
}

/// The tables and statements of one dialect.
struct Sql {
    ddl: Vec<String>,
    drop: Vec<String>,
    insert_run: String,
    insert_message: String,
    /// PostgreSQL, SQLite: one statement returning `(id, run_id)`; MySQL: the select.
    claim_message: String,
    /// MySQL: the update after the select.
    mark_message: String,
    claim_run: String,
    renew: String,
    insert_step: String,
    settle: String,
    delete_message: String,
}

impl Sql {
    fn new(dialect: Dialect, prefix: &str) -> Self {
        let runs = format!("{prefix}_raw_runs");
        let steps = format!("{prefix}_raw_steps");
        let messages = format!("{prefix}_raw_messages");
        let serial = match dialect {
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            _ => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        };
        let r = |sql: &str| dialect.render(sql);
        let next = format!(
            "SELECT id FROM {messages} WHERE delivered_at IS NULL ORDER BY id LIMIT 1{{skip_locked}}"
        );
        let claim_message = match dialect {
            Dialect::Mysql => r(&next.replace("SELECT id ", "SELECT id, run_id ")),
            _ => r(&format!(
                "UPDATE {messages} SET delivered_at = {{now}}, delivery = ? WHERE id = ({next}) RETURNING id, run_id"
            )),
        };
        Self {
            ddl: vec![
                format!(
                    "CREATE TABLE {runs} (id VARCHAR(36) PRIMARY KEY, status VARCHAR(16) NOT NULL, \
                     claimed_by VARCHAR(64), lease_expires BIGINT NOT NULL, output TEXT, updated_at BIGINT NOT NULL)"
                ),
                // The reaper's index, as the run store has it.
                format!("CREATE INDEX {runs}_lease_idx ON {runs} (status, lease_expires)"),
                format!(
                    "CREATE TABLE {steps} (run_id VARCHAR(36) NOT NULL, idx BIGINT NOT NULL, name VARCHAR(64) NOT NULL, \
                     output TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (run_id, idx))"
                ),
                format!(
                    "CREATE TABLE {messages} (id {serial}, run_id VARCHAR(36) NOT NULL, \
                     delivered_at BIGINT, delivery VARCHAR(36))"
                ),
                format!("CREATE INDEX {messages}_next_idx ON {messages} (delivered_at, id)"),
            ],
            drop: vec![
                format!("DROP TABLE IF EXISTS {messages}"),
                format!("DROP TABLE IF EXISTS {steps}"),
                format!("DROP TABLE IF EXISTS {runs}"),
            ],
            insert_run: r(&format!(
                "INSERT INTO {runs} (id, status, lease_expires, updated_at) VALUES (?, 'queued', 0, {{now}})"
            )),
            insert_message: r(&format!("INSERT INTO {messages} (run_id) VALUES (?)")),
            claim_message,
            mark_message: r(&format!(
                "UPDATE {messages} SET delivered_at = {{now}}, delivery = ? WHERE id = ?"
            )),
            claim_run: r(&format!(
                "UPDATE {runs} SET status = 'running', claimed_by = ?, lease_expires = {{now}} + ?, \
                 updated_at = {{now}} WHERE id = ? AND status = 'queued'"
            )),
            renew: r(&format!(
                "UPDATE {runs} SET lease_expires = {{now}} + ?, updated_at = {{now}} \
                 WHERE id = ? AND status = 'running' AND claimed_by = ?"
            )),
            insert_step: r(&format!(
                "INSERT INTO {steps} (run_id, idx, name, output, created_at) VALUES (?, ?, ?, ?, {{now}})"
            )),
            settle: r(&format!(
                "UPDATE {runs} SET status = 'succeeded', output = ?, claimed_by = NULL, lease_expires = 0, \
                 updated_at = {{now}} WHERE id = ? AND status = 'running' AND claimed_by = ?"
            )),
            delete_message: r(&format!(
                "DELETE FROM {messages} WHERE id = ? AND delivery = ?"
            )),
        }
    }
}

/// The lease every claim and renewal takes.
const LEASE_MS: i64 = 30_000;

/// The raw loop on one sqlx driver.
macro_rules! raw_runs {
    ($name:ident, $db:ty) => {
        /// The raw loop on one sqlx driver: its pool and its statements.
        pub struct $name {
            pool: sqlx::Pool<$db>,
            sql: Sql,
            mysql: bool,
        }

        impl $name {
            async fn submit(&self, id: &str) -> RawResult {
                let mut tx = self.pool.begin().await.map_err(failed("begin"))?;
                sqlx::query(&self.sql.insert_run)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert a run"))?;
                sqlx::query(&self.sql.insert_message)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert its message"))?;
                tx.commit().await.map_err(failed("commit a submit"))
            }

            /// One message claimed under `delivery`: `(message id, run id)`.
            async fn claim_message(&self, delivery: &str) -> RawResult<Option<(i64, String)>> {
                use sqlx::Row as _;
                if !self.mysql {
                    let row = sqlx::query(&self.sql.claim_message)
                        .bind(delivery)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(failed("claim a message"))?;
                    return row
                        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                        .transpose()
                        .map_err(failed("read a message"));
                }
                let mut tx = self.pool.begin().await.map_err(failed("begin"))?;
                let row = sqlx::query(&self.sql.claim_message)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(failed("select a message"))?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let (id, run): (i64, String) = (
                    row.try_get(0).map_err(failed("read a message"))?,
                    row.try_get(1).map_err(failed("read a message"))?,
                );
                sqlx::query(&self.sql.mark_message)
                    .bind(delivery)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("claim a message"))?;
                tx.commit()
                    .await
                    .map_err(failed("commit a message claim"))?;
                Ok(Some((id, run)))
            }

            /// Claims, steps and settles the run of a claimed message, then deletes it.
            async fn execute(&self, me: &str, message: i64, run: &str, steps: u64) -> RawResult {
                let claimed = sqlx::query(&self.sql.claim_run)
                    .bind(me)
                    .bind(LEASE_MS)
                    .bind(run)
                    .execute(&self.pool)
                    .await
                    .map_err(failed("claim a run"))?;
                if claimed.rows_affected() == 1 {
                    for i in 0..steps {
                        let mut tx = self.pool.begin().await.map_err(failed("begin"))?;
                        let renewed = sqlx::query(&self.sql.renew)
                            .bind(LEASE_MS)
                            .bind(run)
                            .bind(me)
                            .execute(&mut *tx)
                            .await
                            .map_err(failed("renew a lease"))?;
                        if renewed.rows_affected() != 1 {
                            return Err(RawError::failed("raw runs loop: a run's lease was lost"));
                        }
                        sqlx::query(&self.sql.insert_step)
                            .bind(run)
                            .bind(i as i64)
                            .bind(STEP_NAMES[(i as usize).min(STEP_NAMES.len() - 1)])
                            .bind("null")
                            .execute(&mut *tx)
                            .await
                            .map_err(failed("insert a step"))?;
                        tx.commit().await.map_err(failed("commit a step"))?;
                    }
                    let settled = sqlx::query(&self.sql.settle)
                        .bind("\"ok\"")
                        .bind(run)
                        .bind(me)
                        .execute(&self.pool)
                        .await
                        .map_err(failed("settle a run"))?;
                    if settled.rows_affected() != 1 {
                        return Err(RawError::failed("raw runs loop: a settle matched no run"));
                    }
                }
                sqlx::query(&self.sql.delete_message)
                    .bind(message)
                    .bind(me)
                    .execute(&self.pool)
                    .await
                    .map_err(failed("delete a message"))?;
                Ok(())
            }
        }
    };
}

const STEP_NAMES: [&str; 3] = ["one", "two", "three"];

#[cfg(feature = "sqlite")]
raw_runs!(RawSqlite, sqlx::Sqlite);
#[cfg(feature = "postgres")]
raw_runs!(RawPostgres, sqlx::Postgres);
#[cfg(feature = "mysql")]
raw_runs!(RawMysql, sqlx::MySql);

/// The raw loop on the dialect of the bench's database.
pub enum RawRuns {
    /// On SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(RawSqlite),
    /// On PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(RawPostgres),
    /// On MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(RawMysql),
}

/// Dispatches `$call` to the driver's loop.
macro_rules! on_driver {
    ($self:expr, $raw:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            RawRuns::Sqlite($raw) => $call,
            #[cfg(feature = "postgres")]
            RawRuns::Postgres($raw) => $call,
            #[cfg(feature = "mysql")]
            RawRuns::Mysql($raw) => $call,
        }
    };
}

impl RawRuns {
    /// Its tables on `dsn`, with a pool of `connections` (one on SQLite).
    pub async fn connect(
        dsn: &str,
        dialect: Dialect,
        prefix: &str,
        connections: u32,
    ) -> RawResult<Self> {
        let settings = PoolSettings {
            max_connections: Some(if dialect == Dialect::Sqlite {
                1
            } else {
                connections
            }),
            ..PoolSettings::default()
        };
        let connect = |e: sqlx::Error| {
            RawError::failed(format!("raw runs loop: cannot connect: {}", chain(&e)))
        };
        let sql = Sql::new(dialect, prefix);
        let raw = match dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Self::Sqlite(RawSqlite {
                pool: courier_sql::sqlite_pool(dsn, &settings)
                    .await
                    .map_err(connect)?,
                sql,
                mysql: false,
            }),
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Self::Postgres(RawPostgres {
                pool: courier_sql::postgres_pool(dsn, &settings)
                    .await
                    .map_err(connect)?
                    .0,
                sql,
                mysql: false,
            }),
            #[cfg(feature = "mysql")]
            Dialect::Mysql => Self::Mysql(RawMysql {
                pool: courier_sql::mysql_pool(dsn, &settings)
                    .await
                    .map_err(connect)?
                    .0,
                sql,
                mysql: true,
            }),
            #[allow(unreachable_patterns, reason = "every dialect's feature may be on")]
            _ => {
                let _ = (dsn, settings, connect, sql);
                return Err(RawError::unsupported(
                    "--runs: this binary lacks the driver of --dsn",
                ));
            }
        };
        let created = async {
            for ddl in &raw.sql().ddl {
                on_driver!(&raw, r => sqlx::query(ddl).execute(&r.pool).await.map(|_| ()))
                    .map_err(failed("create its tables"))?;
            }
            Ok::<_, RawError>(())
        };
        if let Err(e) = created.await {
            raw.drop_tables().await;
            return Err(e);
        }
        Ok(raw)
    }

    fn sql(&self) -> &Sql {
        on_driver!(self, r => &r.sql)
    }

    /// What a run costs the raw loop.
    pub fn cost(&self, steps: u64) -> RawCost {
        let dialect = match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => Dialect::Postgres,
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => Dialect::Mysql,
        };
        RawCost::of(dialect, steps)
    }

    /// Submits `runs` runs one at a time; the time it took.
    pub async fn submit(&self, runs: u64) -> RawResult<Duration> {
        let started = Instant::now();
        for _ in 0..runs {
            let id = uuid::Uuid::new_v4().to_string();
            on_driver!(self, r => r.submit(&id).await)?;
        }
        Ok(started.elapsed())
    }

    /// Executes every submitted run with `tasks` concurrent loops; the time it took.
    pub async fn execute(
        self: &Arc<Self>,
        runs: u64,
        tasks: usize,
        steps: u64,
        stall: Duration,
    ) -> RawResult<Duration> {
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks.max(1))
            .map(|i| {
                let raw = self.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    raw.work(&format!("raw-{i}"), runs, steps, &done, stall)
                        .await
                })
            })
            .collect();
        let mut first_error = None;
        for handle in handles {
            let result = handle
                .await
                .unwrap_or_else(|e| Err(RawError::failed(format!("raw runs loop: {e}"))));
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(started.elapsed()),
        }
    }

    async fn work(
        &self,
        me: &str,
        runs: u64,
        steps: u64,
        done: &AtomicU64,
        stall: Duration,
    ) -> RawResult {
        let mut idle_since: Option<Instant> = None;
        while done.load(Ordering::Acquire) < runs {
            let claimed = on_driver!(self, r => r.claim_message(me).await)?;
            let Some((message, run)) = claimed else {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > stall {
                    return Err(RawError::failed(format!(
                        "raw runs loop: {} of {runs} runs finished, then none for {stall:?}",
                        done.load(Ordering::Acquire)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            };
            idle_since = None;
            on_driver!(self, r => r.execute(me, message, &run, steps).await)?;
            done.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Drops its tables.
    pub async fn drop_tables(&self) {
        for sql in &self.sql().drop {
            let _ = on_driver!(self, r => sqlx::query(sql).execute(&r.pool).await.map(|_| ()));
        }
    }
}
