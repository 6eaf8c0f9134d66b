//! Inserting runs on SQL: queued or interactive, and the unique insert that a unique index
//! decides.

use uuid::Uuid;

use super::row::column;
use super::{RunDialect, Runs, db, is_deadlock, rows_error};
use crate::store::{Inserted, NewRun, Run, RunStore, StoreError, UniqueKey, lease_ms};

/// A run's budget as bound to its column.
fn budget_json(run: &NewRun) -> Option<serde_json::Value> {
    run.budget
        .filter(|b| !b.is_unlimited())
        .and_then(|b| serde_json::to_value(b).ok())
}

/// How many times a unique insert goes round before it gives up.
const UNIQUE_ATTEMPTS: usize = 8;

/// What the unique insert did.
enum Taken {
    /// Inserted, the row read in the same statement.
    Row(Box<Run>),
    /// Inserted, the row to be read back (MySQL).
    Written,
    /// The key is held: nothing inserted.
    Held,
}

fn vanished(id: Uuid) -> StoreError {
    StoreError::Corrupt(format!("run {id} vanished"))
}

impl<DB> Runs<DB>
where
    Self: RunStore,
    DB: RunDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> serde_json::Value: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<&'q str>: sqlx::Encode<'q, DB>,
    for<'q> Option<serde_json::Value>: sqlx::Encode<'q, DB>,
    for<'r> Run: sqlx::FromRow<'r, DB::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> String: sqlx::Decode<'r, DB>,
    for<'r> i64: sqlx::Decode<'r, DB>,
    for<'r> serde_json::Value: sqlx::Decode<'r, DB>,
    for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
{
    /// [`RunStore::insert_queued_unique`](crate::RunStore::insert_queued_unique).
    pub(super) async fn insert_unique_run(
        &self,
        run: &NewRun,
        unique: &UniqueKey,
    ) -> Result<Inserted, StoreError> {
        let key = unique.key();
        // Clear an expired key, insert unless the key is held, else read its holder. A holder
        // whose key expired between the insert and the read, or (MySQL) a deadlock between
        // concurrent takers, goes round again.
        for _ in 0..UNIQUE_ATTEMPTS {
            let cleared = sqlx::query(&self.q.clear_unique)
                .bind(key)
                .execute(&self.pool)
                .await;
            match cleared {
                Err(e) if is_deadlock(&e) => continue,
                other => other.map_err(db("clear expired unique key"))?,
            };
            match self.insert_unique(run, unique).await {
                Ok(Taken::Row(row)) => return Ok(Inserted::Queued(row)),
                Ok(Taken::Written) => {
                    let row = self.find(run.id).await?;
                    let row = row.ok_or_else(|| vanished(run.id))?;
                    return Ok(Inserted::Queued(Box::new(row)));
                }
                Ok(Taken::Held) => {}
                Err(e) if is_deadlock(&e) => continue,
                Err(e) => return Err(rows_error("insert unique run")(e)),
            }
            let holder = sqlx::query(&self.q.unique_holder)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(db("unique key holder"))?;
            if let Some(row) = holder {
                let id: DB::Id = column(&row, "id")?;
                return Ok(Inserted::Duplicate(DB::uuid(id)));
            }
        }
        Err(StoreError::Corrupt(format!(
            "unique key `{key}` changed hands {UNIQUE_ATTEMPTS} times during one enqueue"
        )))
    }

    /// Inserts a run with one of the insert statements (binds: id, agent, input, budget, concurrency key) and returns it:
    /// in the same statement (`INSERT ... RETURNING`) where the database can, else read back.
    pub(super) async fn insert(&self, sql: &str, run: &NewRun) -> Result<Run, StoreError> {
        if self.insert_returning {
            let _turn = self.turn().await;
            return sqlx::query_as(sql)
                .bind(DB::id(run.id))
                .bind(run.agent.as_str())
                .bind(run.input.clone())
                .bind(budget_json(run))
                .bind(run.concurrency_key.as_deref())
                .fetch_one(&self.pool)
                .await
                .map_err(rows_error("insert run"));
        }
        sqlx::query(sql)
            .bind(DB::id(run.id))
            .bind(run.agent.as_str())
            .bind(run.input.clone())
            .bind(budget_json(run))
            .bind(run.concurrency_key.as_deref())
            .execute(&self.pool)
            .await
            .map_err(db("insert run"))?;
        self.find(run.id).await?.ok_or_else(|| vanished(run.id))
    }

    /// The unique insert: the run as stored (or only written: MySQL), or nothing, the key held.
    async fn insert_unique(&self, run: &NewRun, unique: &UniqueKey) -> Result<Taken, sqlx::Error> {
        let sql = &self.q.insert_unique;
        if self.insert_returning {
            let row = sqlx::query_as(sql)
                .bind(DB::id(run.id))
                .bind(run.agent.as_str())
                .bind(run.input.clone())
                .bind(budget_json(run))
                .bind(run.concurrency_key.as_deref())
                .bind(unique.key())
                .bind(lease_ms(unique.period()))
                .fetch_optional(&self.pool)
                .await?;
            return Ok(row.map_or(Taken::Held, |row| Taken::Row(Box::new(row))));
        }
        let done = sqlx::query(sql)
            .bind(DB::id(run.id))
            .bind(run.agent.as_str())
            .bind(run.input.clone())
            .bind(budget_json(run))
            .bind(run.concurrency_key.as_deref())
            .bind(unique.key())
            .bind(lease_ms(unique.period()))
            .execute(&self.pool)
            .await?;
        Ok(if DB::rows_affected(&done) > 0 {
            Taken::Written
        } else {
            Taken::Held
        })
    }
}
