//! The schedule store on SQL: one row per schedule in `<table>_schedules` beside the message
//! table (`courier_messages` -> `courier_schedules`), with its lease (owner, `lease_until` from
//! the database clock) and its last fired tick.
//!
//! A claim is one upsert that takes the row when it is new, ours or expired (then a `SELECT`
//! reads who holds it); a tick is recorded by one `UPDATE ... WHERE owner = ? AND lease_until >=
//! now AND (last_tick IS NULL OR last_tick < ?)`, so two workers never fire the same tick.

use std::time::Duration;

use async_trait::async_trait;
use courier_core::schedule::{Held, ScheduleState};
use courier_core::{ScheduleStore, TransportError};
use sqlx::Pool;

use crate::error::{retry_transient, transport_error};
use crate::{Dialect, SqlDatabase};

/// The schedule table of a message table: a `_messages` suffix becomes `_schedules`, any other
/// name gets `_schedules` appended (`courier_messages` -> `courier_schedules`).
#[must_use]
pub fn schedules_table(messages_table: &str) -> String {
    crate::dialect::beside(messages_table, "schedules")
}

/// A row as read back: owner, lease_until, last_tick.
pub(crate) type Row = (String, i64, Option<i64>);

#[derive(Debug)]
struct Statements {
    claim: String,
    read: String,
    advance: String,
}

impl Statements {
    fn new(dialect: Dialect, t: &str) -> Self {
        let insert = format!(
            "INSERT INTO {t} (name, owner, lease_until, last_tick) VALUES (?, ?, {{now}} + ?, NULL)"
        );
        let upsert = match dialect {
            // The owner is decided first; the lease follows only when the owner is now ours.
            Dialect::Mysql => " ON DUPLICATE KEY UPDATE \
                 owner = IF(owner = VALUES(owner) OR lease_until < {now}, VALUES(owner), owner), \
                 lease_until = IF(owner = VALUES(owner), VALUES(lease_until), lease_until)"
                .to_owned(),
            _ => format!(
                " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, \
                 lease_until = excluded.lease_until \
                 WHERE {t}.owner = excluded.owner OR {t}.lease_until < {{now}}"
            ),
        };
        let owner = match dialect {
            Dialect::Mysql => "CAST(owner AS CHAR) AS owner",
            _ => "owner",
        };
        Self {
            claim: dialect.render(&format!("{insert}{upsert}")),
            read: dialect.render(&format!(
                "SELECT {owner}, lease_until, last_tick FROM {t} WHERE name = ?"
            )),
            advance: dialect.render(&format!(
                "UPDATE {t} SET last_tick = ? WHERE name = ? AND owner = ? \
                 AND lease_until >= {{now}} AND (last_tick IS NULL OR last_tick < ?)"
            )),
        }
    }
}

/// The schedule store of one message table on the database `DB`.
pub(crate) struct SqlSchedules<DB: SqlDatabase> {
    pool: Pool<DB>,
    sql: Statements,
    name: String,
    location: String,
}

impl<DB: SqlDatabase> std::fmt::Debug for SqlSchedules<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlSchedules")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlDatabase> SqlSchedules<DB> {
    /// `location`: the redacted DSN without its query; the table is added to it.
    pub(crate) fn new(pool: Pool<DB>, table: &str, name: &str, location: &str) -> Self {
        Self {
            pool,
            sql: Statements::new(DB::DIALECT, table),
            name: name.to_owned(),
            location: format!("{location}#{table}"),
        }
    }
}

async fn read<DB>(store: &SqlSchedules<DB>, schedule: &str) -> Result<Option<Row>, TransportError>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
{
    let context = "reading a schedule";
    retry_transient(context, || {
        sqlx::query_as::<_, Row>(&store.sql.read)
            .bind(schedule)
            .fetch_optional(&store.pool)
    })
    .await
    .map_err(|e| transport_error(&store.name, context, e))
}

#[async_trait]
impl<DB> ScheduleStore for SqlSchedules<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
{
    async fn claim(
        &self,
        schedule: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Held>, TransportError> {
        let context = "claiming a schedule's lease";
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 4);
        retry_transient(context, || {
            sqlx::query(&self.sql.claim)
                .bind(schedule)
                .bind(owner)
                .bind(lease_ms)
                .execute(&self.pool)
        })
        .await
        .map_err(|e| transport_error(&self.name, context, e))?;
        Ok(read(self, schedule)
            .await?
            .filter(|(holder, _, _)| holder == owner)
            .map(|(_, _, last)| Held::new(last)))
    }

    async fn advance(
        &self,
        schedule: &str,
        owner: &str,
        tick_ms: i64,
    ) -> Result<bool, TransportError> {
        let context = "recording a schedule's tick";
        let done = retry_transient(context, || {
            sqlx::query(&self.sql.advance)
                .bind(tick_ms)
                .bind(schedule)
                .bind(owner)
                .bind(tick_ms)
                .execute(&self.pool)
        })
        .await
        .map_err(|e| transport_error(&self.name, context, e))?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn state(&self, schedule: &str) -> Result<Option<ScheduleState>, TransportError> {
        Ok(read(self, schedule)
            .await?
            .map(|(owner, until, last)| ScheduleState::new(Some(owner), until, last)))
    }

    fn location(&self) -> Option<String> {
        Some(self.location.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_is_recorded_only_by_the_live_holder_and_only_forward() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql] {
            let s = Statements::new(dialect, "s");
            assert!(s.advance.contains("owner ="), "{dialect:?}");
            assert!(s.advance.contains("last_tick <"), "{dialect:?}");
            assert!(!s.claim.contains("{now}"), "{dialect:?}");
        }
    }
}
