//! Paused queues on SQL (`courier pause`): a row per paused queue in `<table>_paused` beside
//! the message table (`courier_messages` -> `courier_paused`, migration `0007`, recorded with the
//! schedule table's). Pausing inserts the row (a no-op when present), resuming deletes it.

use async_trait::async_trait;
use courier_core::TransportError;
use sqlx::Pool;

use crate::error::{retry_transient, transport_error};
use crate::{Dialect, SqlDatabase};

/// The paused-queues table of a message table (`courier_messages` -> `courier_paused`).
#[must_use]
pub fn paused_table(messages_table: &str) -> String {
    crate::dialect::beside(messages_table, "paused")
}

/// The pause flag of one queue: a row in `<table>_paused` while it is paused.
pub(crate) struct SqlPause<DB: SqlDatabase> {
    pool: Pool<DB>,
    pause: String,
    resume: String,
    check: String,
    name: String,
    queue: String,
}

impl<DB: SqlDatabase> SqlPause<DB> {
    pub(crate) fn new(pool: Pool<DB>, table: &str, name: &str, queue: &str) -> Self {
        let d = DB::DIALECT;
        let pause = match d {
            Dialect::Mysql => {
                format!("INSERT IGNORE INTO {table} (queue_name, paused_at) VALUES (?, {{now}})")
            }
            _ => format!(
                "INSERT INTO {table} (queue_name, paused_at) VALUES (?, {{now}}) ON CONFLICT (queue_name) DO NOTHING"
            ),
        };
        Self {
            pool,
            pause: d.render(&pause),
            resume: d.render(&format!("DELETE FROM {table} WHERE queue_name = ?")),
            check: d.render(&format!(
                "SELECT COUNT(*) FROM {table} WHERE queue_name = ?"
            )),
            name: name.to_owned(),
            queue: queue.to_owned(),
        }
    }
}

#[async_trait]
impl<DB> courier_core::Pausable for SqlPause<DB>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    async fn set_paused(&self, paused: bool) -> Result<bool, TransportError> {
        let context = if paused {
            "pausing the queue"
        } else {
            "resuming the queue"
        };
        let sql = if paused { &self.pause } else { &self.resume };
        let done = retry_transient(context, || {
            sqlx::query(sql)
                .bind(self.queue.as_str())
                .execute(&self.pool)
        })
        .await
        .map_err(|e| transport_error(&self.name, context, e))?;
        Ok(DB::rows_affected(&done) > 0)
    }

    async fn is_paused(&self) -> Result<bool, TransportError> {
        let context = "reading the pause flag";
        let (n,): (i64,) = retry_transient(context, || {
            sqlx::query_as(&self.check)
                .bind(self.queue.as_str())
                .fetch_one(&self.pool)
        })
        .await
        .map_err(|e| transport_error(&self.name, context, e))?;
        Ok(n > 0)
    }
}

/// A pause flag that is never set, for backends faked in unit tests.
#[cfg(test)]
pub(crate) struct NeverPaused;

#[cfg(test)]
#[async_trait]
impl courier_core::Pausable for NeverPaused {
    async fn set_paused(&self, _: bool) -> Result<bool, TransportError> {
        Ok(false)
    }
    async fn is_paused(&self) -> Result<bool, TransportError> {
        Ok(false)
    }
}
