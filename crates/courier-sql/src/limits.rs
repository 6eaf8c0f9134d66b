//! Rate-limit buckets on SQL (`rate_limit` on a transport): one row per queue in
//! `<table>_limits` beside the message table (`courier_messages` -> `courier_limits`, migration
//! `0008`, recorded with the schedule table's), holding the bucket's theoretical arrival time
//! (`tat`, epoch microseconds of the database clock; see [`RateLimit`]).
//!
//! A take is one upsert computed from the row as it stands (the row lock orders concurrent
//! takes of workers on any host): PostgreSQL and SQLite return the new row with `RETURNING`;
//! MySQL / MariaDB, which has no `RETURNING` on upserts, reads it back in the same transaction
//! (its row lock held until the commit). A new row starts as a full bucket and grants nothing
//! on that first statement: the gate asks again at once.

use async_trait::async_trait;
use courier_core::{RateLimit, RateLimiter, Taken, TransportError};
use sqlx::Pool;

use crate::error::{retry_transient, transport_error};
use crate::{Dialect, SqlDatabase};

/// The rate-limit table of a message table (`courier_messages` -> `courier_limits`).
#[must_use]
pub fn limits_table(messages_table: &str) -> String {
    crate::dialect::beside(messages_table, "limits")
}

/// `tat`, `granted` and the database's now, in microseconds.
pub(crate) type Row = (i64, i64, i64);

/// The bucket of one queue.
pub(crate) struct SqlLimits<DB: SqlDatabase> {
    pool: Pool<DB>,
    take: String,
    /// MySQL: the read-back of the row the upsert left (in the same transaction).
    read: Option<String>,
    name: String,
    queue: String,
}

/// The database clock in epoch microseconds, fixed for a statement.
fn now_us(dialect: Dialect) -> String {
    match dialect {
        Dialect::Postgres => {
            "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)".to_owned()
        }
        Dialect::Mysql => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)".to_owned(),
        Dialect::Sqlite => format!("({} * 1000)", dialect.now_ms_sql()),
    }
}

impl<DB: SqlDatabase> SqlLimits<DB> {
    pub(crate) fn new(pool: Pool<DB>, table: &str, name: &str, queue: &str) -> Self {
        let d = DB::DIALECT;
        let now = now_us(d);
        let least = if d == Dialect::Sqlite { "MIN" } else { "LEAST" };
        // Binds: queue, then want, burst * E, E (room = (now + burst * E - base) / E), then E.
        let insert = format!("INSERT INTO {table} (queue_name, tat, granted) VALUES (?, {now}, 0)");
        let (take, read) = match d {
            // MySQL assigns left to right: `tat` sees the `granted` just set.
            Dialect::Mysql => (
                format!(
                    "{insert} ON DUPLICATE KEY UPDATE \
                     granted = LEAST(?, GREATEST(0, ({now} + ? - GREATEST(tat, {now})) DIV ?)), \
                     tat = GREATEST(tat, {now}) + ? * granted"
                ),
                Some(format!(
                    "SELECT tat, granted, {now} FROM {table} WHERE queue_name = ?"
                )),
            ),
            _ => {
                let base = format!("{{greatest}}({table}.tat, {now})");
                let granted = format!("{least}(?, {{greatest}}(0, ({now} + ? - {base}) / ?))");
                (
                    format!(
                        "{insert} ON CONFLICT (queue_name) DO UPDATE SET \
                         granted = {granted}, tat = {base} + ? * {granted} \
                         RETURNING tat, granted, {now}"
                    ),
                    None,
                )
            }
        };
        Self {
            pool,
            take: d.render(&take),
            read: read.map(|r| d.render(&r)),
            name: name.to_owned(),
            queue: queue.to_owned(),
        }
    }
}

#[async_trait]
impl<DB> RateLimiter for SqlLimits<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
{
    async fn take(&self, limit: &RateLimit, want: u32) -> Result<Taken, TransportError> {
        let context = "taking rate-limit tokens";
        let (e, tolerance, want) = (limit.emission_us(), limit.tolerance_us(), i64::from(want));
        // After the queue: the first `granted` expression, then (PostgreSQL, SQLite) the
        // repeated one of the `tat` assignment, or (MySQL) only `E` of `tat = ... + E * granted`.
        let binds: &[i64] = if self.read.is_some() {
            &[want, tolerance, e, e]
        } else {
            &[want, tolerance, e, e, want, tolerance, e]
        };
        let (tat, granted, now): Row = retry_transient(context, || async {
            match &self.read {
                None => {
                    let q = sqlx::query_as::<_, Row>(&self.take).bind(self.queue.as_str());
                    binds
                        .iter()
                        .fold(q, |q, b| q.bind(*b))
                        .fetch_one(&self.pool)
                        .await
                }
                Some(read) => {
                    let mut tx = self.pool.begin().await?;
                    let q = sqlx::query(&self.take).bind(self.queue.as_str());
                    binds
                        .iter()
                        .fold(q, |q, b| q.bind(*b))
                        .execute(&mut *tx)
                        .await?;
                    let row: Row = sqlx::query_as(read)
                        .bind(self.queue.as_str())
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(row)
                }
            }
        })
        .await
        .map_err(|e| transport_error(&self.name, context, e))?;
        Ok(limit.taken(tat, now, granted))
    }
}
