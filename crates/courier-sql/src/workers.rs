//! The worker registry on SQL: one row per running worker in `<table>_workers` beside the
//! message table (`courier_messages` -> `courier_workers`), every time from the database clock.
//!
//! Each operation is one statement, except where the dialect needs a second: `list` prunes the
//! stale rows, then reads the live ones; a heartbeat whose row is gone registers it again; MySQL
//! has no `UPDATE ... RETURNING`, so its heartbeat reads the stop flag with a second `SELECT`.
//! A heartbeat never writes `stop_requested`, so a stop request is never lost to it.

use std::time::Duration;

use async_trait::async_trait;
use courier_core::{Heartbeat, TransportError, WorkerRecord, WorkerRegistry};
use sqlx::Pool;

use crate::error::{retry_transient, transport_error};
use crate::{Dialect, SqlDatabase};

/// The registry table of a message table: a `_messages` suffix becomes `_workers`, any other
/// name gets `_workers` appended (`courier_messages` -> `courier_workers`, `jobs` ->
/// `jobs_workers`). The message table is a validated identifier, so this one is too.
#[must_use]
pub fn workers_table(messages_table: &str) -> String {
    crate::dialect::beside(messages_table, "workers")
}

const COLUMNS: &str = "id, host, pid, version, transports, started_at, last_heartbeat, handled, failed, stop_requested";

/// The statements, rendered once for a dialect and table.
#[derive(Debug)]
struct Statements {
    register: String,
    heartbeat: String,
    stop_flag: String,
    unregister: String,
    prune: String,
    list: String,
    stop_all: String,
    stop_one: String,
}

impl Statements {
    fn new(dialect: Dialect, t: &str) -> Self {
        let r = |template: String| dialect.render(&template);
        let insert = format!(
            "INSERT INTO {t} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, {{now}}, {{now}}, ?, ?, 0)"
        );
        let upsert = match dialect {
            Dialect::Mysql => {
                " ON DUPLICATE KEY UPDATE host = VALUES(host), pid = VALUES(pid), \
                 version = VALUES(version), transports = VALUES(transports), \
                 started_at = VALUES(started_at), last_heartbeat = VALUES(last_heartbeat), \
                 handled = VALUES(handled), failed = VALUES(failed), stop_requested = 0"
            }
            _ => {
                " ON CONFLICT (id) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                 version = excluded.version, transports = excluded.transports, \
                 started_at = excluded.started_at, last_heartbeat = excluded.last_heartbeat, \
                 handled = excluded.handled, failed = excluded.failed, stop_requested = 0"
            }
        };
        let heartbeat = format!(
            "UPDATE {t} SET last_heartbeat = {{now}}, handled = ?, failed = ? WHERE id = ?"
        );
        let heartbeat = match dialect {
            Dialect::Mysql => heartbeat,
            _ => format!("{heartbeat} RETURNING stop_requested"),
        };
        // MySQL reports a binary-collated column as VARBINARY: read the id back as text.
        let read = match dialect {
            Dialect::Mysql => COLUMNS.replacen("id,", "CAST(id AS CHAR) AS id,", 1),
            _ => COLUMNS.to_owned(),
        };
        Self {
            register: r(format!("{insert}{upsert}")),
            heartbeat: r(heartbeat),
            stop_flag: r(format!("SELECT stop_requested FROM {t} WHERE id = ?")),
            unregister: r(format!("DELETE FROM {t} WHERE id = ?")),
            prune: r(format!(
                "DELETE FROM {t} WHERE last_heartbeat < {{now}} - ?"
            )),
            list: r(format!(
                "SELECT {read} FROM {t} WHERE last_heartbeat >= {{now}} - ? ORDER BY started_at, id"
            )),
            stop_all: r(format!(
                "UPDATE {t} SET stop_requested = 1 WHERE last_heartbeat >= {{now}} - ?"
            )),
            stop_one: r(format!(
                "UPDATE {t} SET stop_requested = 1 WHERE last_heartbeat >= {{now}} - ? AND id = ?"
            )),
        }
    }
}

/// A row as read back.
pub(crate) type Row = (String, String, i64, String, String, i64, i64, i64, i64, i64);

fn record(row: Row) -> WorkerRecord {
    let (id, host, pid, version, transports, started, beat, handled, failed, stop) = row;
    let mut r = WorkerRecord::new(
        id,
        host,
        u32::try_from(pid).unwrap_or(0),
        serde_json::from_str(&transports).unwrap_or_default(),
    );
    r.version = version;
    r.started_at_ms = started;
    r.last_heartbeat_ms = beat;
    r.handled = u64::try_from(handled).unwrap_or(0);
    r.failed = u64::try_from(failed).unwrap_or(0);
    r.stop_requested = stop != 0;
    r
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The worker registry of one message table on the database `DB`.
pub(crate) struct SqlWorkers<DB: SqlDatabase> {
    pool: Pool<DB>,
    sql: Statements,
    /// The transport's name, for errors.
    name: String,
    location: String,
    stale_after: Duration,
}

impl<DB: SqlDatabase> std::fmt::Debug for SqlWorkers<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlWorkers")
            .field("location", &self.location)
            .field("stale_after", &self.stale_after)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlDatabase> SqlWorkers<DB> {
    /// `location`: the redacted DSN without its query; the table is added to it.
    pub(crate) fn new(
        pool: Pool<DB>,
        table: &str,
        name: &str,
        location: &str,
        stale_after: Duration,
    ) -> Self {
        Self {
            pool,
            sql: Statements::new(DB::DIALECT, table),
            name: name.to_owned(),
            location: format!("{location}#{table}"),
            stale_after,
        }
    }

    fn stale_ms(&self) -> i64 {
        i64::try_from(self.stale_after.as_millis()).unwrap_or(i64::MAX / 4)
    }

    fn error(&self, context: &'static str, e: sqlx::Error) -> TransportError {
        transport_error(&self.name, context, e)
    }
}

#[async_trait]
impl<DB> WorkerRegistry for SqlWorkers<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
{
    async fn register(&self, w: &WorkerRecord) -> Result<(), TransportError> {
        let transports = serde_json::to_string(&w.transports).unwrap_or_else(|_| "[]".into());
        retry_transient("registering the worker", || {
            sqlx::query(&self.sql.register)
                .bind(w.id.as_str())
                .bind(w.host.as_str())
                .bind(i64::from(w.pid))
                .bind(w.version.as_str())
                .bind(transports.as_str())
                .bind(count(w.handled))
                .bind(count(w.failed))
                .execute(&self.pool)
        })
        .await
        .map(drop)
        .map_err(|e| self.error("registering the worker", e))
    }

    async fn heartbeat(&self, w: &WorkerRecord) -> Result<Heartbeat, TransportError> {
        let context = "recording a worker heartbeat";
        let beat = || {
            sqlx::query(&self.sql.heartbeat)
                .bind(count(w.handled))
                .bind(count(w.failed))
                .bind(w.id.as_str())
        };
        let stop: Option<i64> = if DB::DIALECT == Dialect::Mysql {
            let done = retry_transient(context, || beat().execute(&self.pool))
                .await
                .map_err(|e| self.error(context, e))?;
            if DB::rows_affected(&done) == 0 {
                None
            } else {
                retry_transient(context, || {
                    sqlx::query_scalar::<_, i64>(&self.sql.stop_flag)
                        .bind(w.id.as_str())
                        .fetch_optional(&self.pool)
                })
                .await
                .map_err(|e| self.error(context, e))?
            }
        } else {
            retry_transient(context, || {
                sqlx::query_scalar::<_, i64>(&self.sql.heartbeat)
                    .bind(count(w.handled))
                    .bind(count(w.failed))
                    .bind(w.id.as_str())
                    .fetch_optional(&self.pool)
            })
            .await
            .map_err(|e| self.error(context, e))?
        };
        match stop {
            Some(flag) => Ok(Heartbeat::new(flag != 0, false)),
            None => {
                self.register(w).await?;
                Ok(Heartbeat::new(false, true))
            }
        }
    }

    async fn unregister(&self, id: &str) -> Result<(), TransportError> {
        retry_transient("unregistering the worker", || {
            sqlx::query(&self.sql.unregister)
                .bind(id)
                .execute(&self.pool)
        })
        .await
        .map(drop)
        .map_err(|e| self.error("unregistering the worker", e))
    }

    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        let context = "listing the workers";
        retry_transient(context, || {
            sqlx::query(&self.sql.prune)
                .bind(self.stale_ms())
                .execute(&self.pool)
        })
        .await
        .map_err(|e| self.error(context, e))?;
        let rows: Vec<Row> = retry_transient(context, || {
            sqlx::query_as(&self.sql.list)
                .bind(self.stale_ms())
                .fetch_all(&self.pool)
        })
        .await
        .map_err(|e| self.error(context, e))?;
        Ok(rows.into_iter().map(record).collect())
    }

    async fn request_stop(&self, id: Option<&str>) -> Result<u64, TransportError> {
        let context = "requesting workers to stop";
        let done = retry_transient(context, || {
            let q = match id {
                None => sqlx::query(&self.sql.stop_all).bind(self.stale_ms()),
                Some(id) => sqlx::query(&self.sql.stop_one)
                    .bind(self.stale_ms())
                    .bind(id),
            };
            q.execute(&self.pool)
        })
        .await
        .map_err(|e| self.error(context, e))?;
        Ok(DB::rows_affected(&done))
    }

    fn stale_after(&self) -> Duration {
        self.stale_after
    }

    fn location(&self) -> Option<String> {
        Some(self.location.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_never_write_the_stop_flag() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql] {
            let s = Statements::new(dialect, "w");
            assert!(!s.heartbeat.contains("stop_requested ="), "{dialect:?}");
            assert!(!s.register.contains("{now}"), "{dialect:?}");
        }
    }
}
