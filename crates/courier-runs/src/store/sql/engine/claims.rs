//! Claims and leases on SQL: the guarded claim (one statement with `RETURNING`, on SQLite
//! through the write combiner; on MySQL the guarded `UPDATE` and a read of the row), lease
//! renewals one by one or many at once, the owner's requeue, and the probe of many runs.

use std::time::Duration;

use courier_sql::Dialect;
use uuid::Uuid;

use super::row::column;
#[cfg(feature = "sqlite")]
use super::row::decode_run;
use super::{RunDialect, Runs, db, in_flight, rows_error};
use crate::store::{Run, RunProbe, StoreError, lease_ms};

/// A step's renew of an owned run's lease: renewed when less than three quarters of it is left
/// (binds that bound, then the lease). A lease that is left as it is keeps the run's indexed
/// columns unchanged, so that on PostgreSQL the step's update of the run's row is a HOT update
/// (no new entry in each of the run table's indexes); the lease never runs below three quarters
/// of its length while steps are written, and the worker's lease watch renews it too.
pub(super) const STEP_LEASE: &str =
    "lease_expires = CASE WHEN lease_expires < {now} + ? THEN {now} + ? ELSE lease_expires END, ";

/// The bound under which a step renews the lease (see [`STEP_LEASE`]), ms from now.
pub(super) fn step_renew_below(lease: Duration) -> i64 {
    let lease = lease_ms(lease);
    lease - lease / 4
}

/// The most ids one `id IN (...)` statement binds.
const MAX_IDS_PER_STATEMENT: usize = 500;

/// `n` placeholders, comma-separated.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

runs_impl! {
[impl<DB> Runs<DB>]
    /// [`RunStore::claim`](crate::RunStore::claim).
    pub(super) async fn claim_run(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Run>, StoreError> {
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            use super::combine::Bind;
            let write = super::combine::Write {
                sql: self.q.claim.clone(),
                statements: 1,
                binds: vec![
                    Bind::Text(worker.to_owned()),
                    Bind::Int(lease_ms(lease)),
                    Bind::Text(id.hyphenated().to_string()),
                ],
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(rows_error("claim"))?;
            return written
                .rows
                .first()
                .and_then(|rows| rows.first())
                .map(decode_run::<sqlx::sqlite::SqliteRow>)
                .transpose();
        }
        #[cfg(feature = "postgres")]
        if let Some(batches) = &self.batches
            && let Ok(run) = in_flight(batches.claim(id, worker, lease_ms(lease))).await
        {
            return Ok(run);
        }
        if DB::DIALECT != Dialect::Mysql {
            // UPDATE ... RETURNING: a row back is the guard matched.
            let q = sqlx::query_as(&self.q.claim)
                .bind(worker)
                .bind(lease_ms(lease))
                .bind(DB::id(id));
            let _turn = self.turn().await;
            return in_flight(q.fetch_optional(&self.pool))
                .await
                .map_err(rows_error("claim"));
        }
        // MySQL: the guarded UPDATE, then a read of the row this worker now owns.
        let q = sqlx::query(&self.q.claim)
            .bind(worker)
            .bind(lease_ms(lease))
            .bind(DB::id(id));
        if !self.matched("claim", in_flight(q.execute(&self.pool)).await)? {
            return Ok(None);
        }
        // Rendered for MySQL only (its `CAST(... AS SIGNED)`); this branch is MySQL's.
        let find = self.q.find_claimed.as_deref().unwrap_or(&self.q.find);
        sqlx::query_as(find)
            .bind(DB::id(id))
            .fetch_optional(&self.pool)
            .await
            .map_err(rows_error("read a claimed run"))
    }

    /// [`RunStore::renew`](crate::RunStore::renew).
    pub(super) async fn renew_lease(
        &self,
        id: Uuid,
        worker: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.renew)
            .bind(lease_ms(lease))
            .bind(DB::id(id))
            .bind(worker);
        self.matched("renew", in_flight(q.execute(&self.pool)).await)
    }

    /// [`RunStore::renew_many`](crate::RunStore::renew_many).
    pub(super) async fn renew_leases(
        &self,
        ids: &[Uuid],
        worker: &str,
        lease: Duration,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut held = std::collections::HashSet::with_capacity(ids.len());
        let mysql = DB::DIALECT == Dialect::Mysql;
        for chunk in ids.chunks(MAX_IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let guard = format!("id IN ({marks}) AND status = 'running' AND claimed_by = ?");
            let update = DB::DIALECT.render(&format!(
                "UPDATE {} SET lease_expires = {{now}} + ?, updated_at = {{now}} WHERE {guard}{}",
                self.runs,
                if mysql { "" } else { " RETURNING id" }
            ));
            let mut q = sqlx::query(&update).bind(lease_ms(lease));
            for &id in chunk {
                q = q.bind(DB::id(id));
            }
            let q = q.bind(worker);
            let rows = if mysql {
                // No UPDATE ... RETURNING: the renew, then a read of the runs still held.
                in_flight(q.execute(&self.pool))
                    .await
                    .map_err(db("renew runs"))?;
                let select =
                    DB::DIALECT.render(&format!("SELECT id FROM {} WHERE {guard}", self.runs));
                let mut q = sqlx::query(&select);
                for &id in chunk {
                    q = q.bind(DB::id(id));
                }
                in_flight(q.bind(worker).fetch_all(&self.pool))
                    .await
                    .map_err(db("renew runs"))?
            } else {
                let _turn = self.turn().await;
                in_flight(q.fetch_all(&self.pool))
                    .await
                    .map_err(db("renew runs"))?
            };
            for row in &rows {
                held.insert(DB::uuid(column(row, "id")?));
            }
        }
        Ok(ids
            .iter()
            .copied()
            .filter(|id| !held.contains(id))
            .collect())
    }

    /// [`RunStore::requeue_owned`](crate::RunStore::requeue_owned).
    pub(super) async fn requeue_run(
        &self,
        id: Uuid,
        worker: &str,
        due_in: Duration,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.requeue_owned)
            .bind(lease_ms(due_in))
            .bind(DB::id(id))
            .bind(worker);
        self.matched("requeue", in_flight(q.execute(&self.pool)).await)
    }

    /// [`RunStore::probe`](crate::RunStore::probe).
    pub(super) async fn probe_runs(&self, ids: &[Uuid]) -> Result<Vec<RunProbe>, StoreError> {
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(MAX_IDS_PER_STATEMENT) {
            let sql = DB::DIALECT.render(&format!(
                "SELECT id, status, claimed_by FROM {} WHERE id IN ({})",
                self.runs,
                marks(chunk.len())
            ));
            let mut q = sqlx::query(&sql);
            for &id in chunk {
                q = q.bind(DB::id(id));
            }
            let rows = in_flight(q.fetch_all(&self.pool))
                .await
                .map_err(db("probe runs"))?;
            for row in &rows {
                let status: String = column(row, "status")?;
                found.push(RunProbe {
                    id: DB::uuid(column(row, "id")?),
                    status: status
                        .parse()
                        .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
                    claimed_by: column(row, "claimed_by")?,
                });
            }
        }
        Ok(found)
    }
}
