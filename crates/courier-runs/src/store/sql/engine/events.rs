//! A run's events on SQL: the append (sequence numbers from `MAX(seq) + 1` in the same
//! statement) and the read.

use sqlx::Row as _;
use uuid::Uuid;

use super::row::{column, corrupt};
use super::{RunDialect, Runs, db, in_flight, is_deadlock};
use crate::store::{Run, RunEvent, StoreError};

runs_impl! {
[impl<DB> Runs<DB>]
    /// [`RunStore::append_event`](crate::RunStore::append_event).
    pub(super) async fn append_run_event(
        &self,
        id: Uuid,
        kind: &str,
        payload: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        // One statement computes MAX(seq)+1 and inserts (and returns it, where the database has
        // INSERT ... RETURNING); MySQL may report a deadlock (40001)
        // between two concurrent INSERT ... SELECT: that statement did nothing and is retried.
        let mut attempt = 0;
        loop {
            let q = sqlx::query(&self.q.append_event)
                .bind(DB::id(id))
                .bind(kind)
                .bind(payload.clone())
                .bind(DB::id(id));
            let done = if self.insert_returning {
                in_flight(q.fetch_one(&self.pool)).await.map(Some)
            } else {
                in_flight(q.execute(&self.pool)).await.map(|_| None)
            };
            let max_seq = || async {
                let (seq,): (i64,) = sqlx::query_as(&self.q.max_seq)
                    .bind(DB::id(id))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db("max seq"))?;
                Ok::<_, StoreError>(seq)
            };
            match done {
                Ok(Some(row)) => return row.try_get_unchecked("seq").map_err(corrupt("seq")),
                Ok(None) => return max_seq().await,
                Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                    let seq = max_seq().await?;
                    return Err(StoreError::DuplicateSequence { run_id: id, seq });
                }
                Err(e) if is_deadlock(&e) && attempt < 5 => {
                    attempt += 1;
                }
                Err(e) => return Err(db("append event")(e)),
            }
        }
    }

    /// [`RunStore::events`](crate::RunStore::events).
    pub(super) async fn run_events(&self, id: Uuid) -> Result<Vec<RunEvent>, StoreError> {
        let rows = sqlx::query(&self.q.events)
            .bind(DB::id(id))
            .fetch_all(&self.pool)
            .await
            .map_err(db("events"))?;
        rows.iter()
            .map(|row| {
                let run_id: DB::Id = column(row, "run_id")?;
                Ok(RunEvent {
                    run_id: DB::uuid(run_id),
                    seq: column(row, "seq")?,
                    kind: column(row, "kind")?,
                    payload: column(row, "payload")?,
                    created_at: column(row, "created_at")?,
                })
            })
            .collect()
    }
}
