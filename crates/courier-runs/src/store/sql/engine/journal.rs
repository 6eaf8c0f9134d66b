//! A durable step's write to the journal, with the renewal of the run's lease where one is due.
//!
//! - PostgreSQL: one statement, a data-modifying CTE (the guarded renew, then the row's write),
//!   batched with the concurrent steps of other runs (`batch.rs`).
//! - SQLite and MySQL: a step that adds no usage to a run whose lease surely has more than three
//!   quarters left (`leases.rs`) is one statement, the row's write guarded by the run's row; the
//!   run's row is left as it is. Otherwise, on SQLite, that write and the renew go as one script
//!   to the connection's thread (`BEGIN IMMEDIATE`, the write, the renew, `COMMIT`, through the
//!   combiner); on MySQL, a transaction of the guarded renew and the row's write, the renew first
//!   so that a refused guard writes nothing (four round trips: the protocol prepares one
//!   statement at a time).

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::claims::step_renew_below;
use super::steps::{is_finished, usage_json};
use super::{RunDialect, Runs, db, in_flight};
use crate::step::{JournalMode, StepWrite};
use crate::store::{Run, StoreError, lease_ms};

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether a write adds usage or replays to the run.
fn counted(w: &StepWrite) -> bool {
    !w.usage.is_zero() || w.replayed > 0
}

/// The renew variant of a write: bit 0 owned, bit 1 counted.
fn variant(owned: bool, w: &StepWrite) -> usize {
    usize::from(owned) | (usize::from(counted(w)) << 1)
}

/// Binds a query's renew: (when owned, `$first` and the lease: the bound under which to renew
/// on PostgreSQL, whether to renew elsewhere), the usage counters and replays, the id, (owner).
macro_rules! bind_renew {
    ($q:expr, $id:expr, $owner:expr, $first:expr, $lease:expr, $w:expr) => {{
        let q = bind_renew!(@head $q, $owner.is_some(), $first, $lease, $w).bind(DB::id($id));
        match $owner {
            Some(owner) => q.bind(owner),
            None => q,
        }
    }};
    // The values before the id: the lease when owned, the usage counters and replays.
    (@head $q:expr, $owned:expr, $first:expr, $lease:expr, $w:expr) => {{
        let mut q = $q;
        if $owned {
            q = q.bind($first).bind(lease_ms($lease));
        }
        if counted($w) {
            q = q
                .bind(count($w.usage.tokens_in))
                .bind(count($w.usage.tokens_out))
                .bind(count($w.usage.cost_micros))
                .bind(count($w.usage.tool_calls))
                .bind(count($w.usage.turns))
                .bind(count($w.replayed));
        }
        q
    }};
}

/// Binds a step row's write: insert (without the run id, which the caller binds first or the
/// CTE supplies) or finish (with the run id and index last).
macro_rules! bind_row {
    ($q:expr, $id:expr, $w:expr) => {{
        let q = $q;
        match $w.mode {
            JournalMode::Insert => q
                .bind($w.index)
                .bind($w.name.as_str())
                .bind($w.effect)
                .bind($w.status.as_str())
                .bind($w.output.clone())
                .bind($w.error.as_deref())
                .bind($w.error_class.as_deref())
                .bind(usage_json(&$w.usage))
                .bind($w.duration_ms)
                .bind(is_finished($w.status))
                .bind(is_finished($w.status)),
            JournalMode::Finish => q
                .bind($w.status.as_str())
                .bind($w.output.clone())
                .bind($w.error.as_deref())
                .bind($w.error_class.as_deref())
                .bind(usage_json(&$w.usage))
                .bind($w.duration_ms)
                .bind(is_finished($w.status))
                .bind(DB::id($id))
                .bind($w.index),
        }
    }};
}

runs_impl! {
[impl<DB> Runs<DB>]
    /// [`RunStore::journal`](crate::RunStore::journal).
    pub(super) async fn journal_step(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease: Duration,
        w: &StepWrite,
    ) -> Result<bool, StoreError> {
        let mode = usize::from(w.mode == JournalMode::Finish);
        #[cfg(feature = "postgres")]
        if let Some(batches) = &self.batches
            && let Ok(done) = in_flight(batches.journal(id, owner, lease_ms(lease), w)).await
        {
            self.shared.add_journal(1);
            return Ok(done);
        }
        if let Some(cte) = &self.sq.cte {
            let sql = &cte[variant(owner.is_some(), w)][mode];
            let q = bind_renew!(sqlx::query(sql), id, owner, step_renew_below(lease), lease, w);
            let q = bind_row!(q, id, w);
            let row = in_flight(q.fetch_optional(&self.pool))
                .await
                .map_err(|e| step_error(id, w, e))?;
            self.shared.add_journal(1);
            return Ok(row.is_some());
        }
        let sent = Instant::now();
        let renew = owner.is_some()
            && !self
                .leases
                .fresh(id, Duration::from_millis(step_renew_below(lease).unsigned_abs()));
        let written = match &self.sq.alone {
            Some(alone) if !renew && !counted(w) => {
                let sql = &alone[usize::from(owner.is_some())][mode];
                self.shared.add_journal(1);
                self.journal_alone(sql, id, owner, w).await
            }
            _ => {
                self.shared
                    .add_journal(if self.sq.script.is_some() { 2 } else { 4 });
                self.journal_with_renew(id, owner, renew.then_some(lease), w)
                    .await
            }
        };
        // A refused write leaves the entry: it may be another worker's of this process, and a
        // stale one costs nothing (every step checks the claim).
        if renew && matches!(written, Ok(true)) {
            self.leases.set(id, sent, lease);
        }
        written
    }

    /// SQLite and MySQL: the step's row alone (`sql`), guarded by the run's (one statement).
    async fn journal_alone(
        &self,
        sql: &str,
        id: Uuid,
        owner: Option<&str>,
        w: &StepWrite,
    ) -> Result<bool, StoreError> {
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            let write = super::combine::Write {
                sql: sql.to_owned(),
                statements: 1,
                binds: script_binds(id, owner, None, w),
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(|e| step_error(id, w, e))?;
            return Ok(written.rows.first().is_some_and(|rows| !rows.is_empty()));
        }
        let q = match w.mode {
            JournalMode::Insert => sqlx::query(sql).bind(DB::id(id)),
            JournalMode::Finish => sqlx::query(sql),
        };
        let q = bind_row!(q, id, w).bind(DB::id(id));
        let q = match owner {
            Some(owner) => q.bind(owner),
            None => q,
        };
        let done = in_flight(q.execute(&self.pool))
            .await
            .map_err(|e| step_error(id, w, e))?;
        Ok(DB::rows_affected(&done) > 0)
    }

    /// SQLite and MySQL: the step's row and the run's (its usage, and its lease when `renew` is
    /// the lease to set).
    async fn journal_with_renew(
        &self,
        id: Uuid,
        owner: Option<&str>,
        renew: Option<Duration>,
        w: &StepWrite,
    ) -> Result<bool, StoreError> {
        let variant = variant(owner.is_some(), w);
        #[cfg(feature = "sqlite")]
        if let (Some(script), Some(combiner)) = (&self.sq.script, &self.combiner) {
            let mode = usize::from(w.mode == JournalMode::Finish);
            let write = super::combine::Write {
                sql: script[variant][mode].clone(),
                statements: 2,
                binds: script_binds(id, owner, Some(renew.unwrap_or_default()), w),
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(|e| step_error(id, w, e))?;
            return Ok(written.rows.first().is_some_and(|rows| !rows.is_empty()));
        }
        let renew_sql = &self.sq.renew[variant];
        let lease = renew.unwrap_or_default();
        let renewing = i64::from(renew.is_some());
        let write = async {
            let mut tx = self.pool.begin().await?;
            let q = bind_renew!(sqlx::query(renew_sql), id, owner, renewing, lease, w);
            if DB::rows_affected(&q.execute(&mut *tx).await?) == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            let q = match w.mode {
                JournalMode::Insert => sqlx::query(&self.sq.insert_step).bind(DB::id(id)),
                JournalMode::Finish => sqlx::query(&self.sq.finish_step),
            };
            let done = bind_row!(q, id, w).execute(&mut *tx).await?;
            if DB::rows_affected(&done) == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        };
        in_flight(write).await.map_err(|e| step_error(id, w, e))
    }
}

/// SQLite: the values of a step's script, in its order: the row (insert: the run id first;
/// finish: the run id and index last), its guard (the run's id and owner), then the renew
/// (lease when owned, the usage counters and replays when counted, the id).
#[cfg(feature = "sqlite")]
fn script_binds(
    id: Uuid,
    owner: Option<&str>,
    renew: Option<Duration>,
    w: &StepWrite,
) -> Vec<super::combine::Bind> {
    use super::combine::Bind;
    let run = || Bind::Text(id.hyphenated().to_string());
    let finished = is_finished(w.status);
    let mut b = Vec::with_capacity(24);
    let values = [
        Bind::Text(w.status.as_str().to_owned()),
        Bind::OptJson(w.output.clone()),
        Bind::OptText(w.error.clone()),
        Bind::OptText(w.error_class.clone()),
        Bind::OptJson(usage_json(&w.usage)),
        Bind::Int(w.duration_ms),
        Bind::Int(finished),
    ];
    match w.mode {
        JournalMode::Insert => {
            b.extend([
                run(),
                Bind::Int(w.index),
                Bind::Text(w.name.clone()),
                Bind::Text(w.effect.to_owned()),
            ]);
            b.extend(values);
            b.push(Bind::Int(finished));
        }
        JournalMode::Finish => {
            b.extend(values);
            b.extend([run(), Bind::Int(w.index)]);
        }
    }
    b.push(run());
    if let Some(owner) = owner {
        b.push(Bind::Text(owner.to_owned()));
    }
    let Some(renew) = renew else {
        return b;
    };
    if owner.is_some() {
        b.push(Bind::Int(i64::from(renew > Duration::ZERO)));
        b.push(Bind::Int(lease_ms(renew)));
    }
    if counted(w) {
        b.extend(
            [
                w.usage.tokens_in,
                w.usage.tokens_out,
                w.usage.cost_micros,
                w.usage.tool_calls,
                w.usage.turns,
                w.replayed,
            ]
            .map(|n| Bind::Int(count(n))),
        );
    }
    b.push(run());
    b
}

/// A journal write's failure: a step index written twice is [`StoreError::DuplicateSequence`].
fn step_error(id: Uuid, w: &StepWrite, e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Database(d) if d.is_unique_violation() => StoreError::DuplicateSequence {
            run_id: id,
            seq: w.index,
        },
        e => db("journal a step")(e),
    }
}
