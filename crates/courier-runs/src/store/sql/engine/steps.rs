//! The step journal's statements (written by `journal.rs`), its reads, and the durable waits on
//! SQL.

use std::time::Duration;

use courier_sql::Dialect;
use uuid::Uuid;

use super::claims::STEP_LEASE;
use super::row::{column, rows_error};
use super::{RunDialect, Runs, db, in_flight, limit};
use crate::RunStatus;
use crate::step::{StepRecord, StepStatus, Usage};
use crate::store::{Run, StoreError, lease_ms};

/// A step's renew of an owned run's lease on SQLite and MySQL: renewed when the store asks
/// (binds 1 or 0, then the lease), which it does when it cannot be sure that more than three
/// quarters of the lease are left (`leases.rs`).
const RENEW_IF: &str = "lease_expires = CASE WHEN ? = 1 THEN {now} + ? ELSE lease_expires END, ";

/// The most runs one prune deletes (its statements bind one id per run).
pub(crate) const MAX_PRUNE_BATCH: usize = 500;

const STEP_COLUMNS: &str = "run_id, idx, name, effect, status, output, error, error_class, step_usage, \
    duration_ms, attempts, created_at, finished_at";
/// The statuses of a row a later write finishes.
const UNFINISHED: &str = "('intent', 'retry', 'waiting')";

/// The statements of the step journal and the durable waits, rendered for one dialect.
#[derive(Debug)]
pub(in crate::store::sql) struct StepQueries {
    /// The guarded renew, indexed by [`variant`](super::journal): owned (binds the lease first)
    /// or interactive, adding usage and replays or not (a step that used nothing binds six fewer
    /// values). PostgreSQL renews an owned run's lease when less than three quarters of it is
    /// left ([`STEP_LEASE`]); MySQL when the store says so ([`RENEW_IF`]).
    pub(super) renew: [String; 4],
    pub(super) insert_step: String,
    pub(super) finish_step: String,
    /// PostgreSQL: the renew and the row's write in one statement, per variant and mode.
    pub(super) cte: Option<[[String; 2]; 4]>,
    /// SQLite: the row's write (guarded by the run's row) and the renew ([`RENEW_IF`]), in one
    /// transaction sent as one script, per variant and mode: one round trip to the connection's
    /// thread. (Read by the combiner, which only SQLite has.)
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(super) script: Option<[[String; 2]; 4]>,
    /// SQLite and MySQL: the row's write alone, guarded by the run's row, per owned and mode:
    /// a step that adds no usage to a run whose lease needs no renewal (one statement).
    pub(super) alone: Option<[[String; 2]; 2]>,
    steps: String,
    suspend_owned: String,
    suspend_interactive: String,
    select_due_waits: String,
    wake_due: String,
    wake_signal: String,
    release_parked: String,
    resolve_step: String,
    copy_steps: String,
}

impl StepQueries {
    pub(in crate::store::sql) fn new(dialect: Dialect, runs: &str) -> Self {
        let render = |sql: &str| {
            dialect.render(
                &sql.replace("{steps}", &format!("{runs}_steps"))
                    .replace("{runs}", runs)
                    .replace("{step_cols}", STEP_COLUMNS)
                    .replace("{unfinished}", UNFINISHED)
                    .replace("{cols}", super::super::queries::COLUMNS),
            )
        };
        let add = "used_tokens_in = used_tokens_in + ?, used_tokens_out = used_tokens_out + ?, \
            used_cost = used_cost + ?, used_tool_calls = used_tool_calls + ?, used_turns = used_turns + ?, \
            steps_replayed = steps_replayed + ?, ";
        let renews: [String; 4] = std::array::from_fn(|v| {
            let (owned, counted) = (v & 1 == 1, v & 2 == 2);
            let lease = match (owned, dialect) {
                (false, _) => "",
                (true, Dialect::Postgres) => STEP_LEASE,
                (true, _) => RENEW_IF,
            };
            let add = if counted { add } else { "" };
            let owner = if owned { "= ?" } else { "IS NULL" };
            format!(
                "UPDATE {{runs}} SET {lease}{add}updated_at = {{now}} \
                 WHERE id = ? AND status = 'running' AND claimed_by {owner}"
            )
        });
        let insert_values =
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {now}, CASE WHEN ? = 1 THEN {now} ELSE NULL END";
        let insert_step =
            format!("INSERT INTO {{steps}} ({{step_cols}}) VALUES (?, {insert_values})");
        let finish_set = "status = ?, output = ?, error = ?, error_class = ?, step_usage = ?, duration_ms = ?, \
            attempts = {steps}.attempts + 1, finished_at = CASE WHEN ? = 1 THEN {now} ELSE NULL END";
        let finish_step = format!(
            "UPDATE {{steps}} SET {finish_set} WHERE run_id = ? AND idx = ? AND status IN {{unfinished}}"
        );
        let cte = (dialect == Dialect::Postgres).then(|| {
            let with = |renew: &str| format!("WITH run AS ({renew} RETURNING id) ");
            let insert = |renew: &str| {
                render(&format!(
                    "{}INSERT INTO {{steps}} ({{step_cols}}) SELECT run.id, {insert_values} FROM run RETURNING idx",
                    with(renew)
                ))
            };
            let finish = |renew: &str| {
                render(&format!(
                    "{}UPDATE {{steps}} SET {finish_set} FROM run WHERE {{steps}}.run_id = run.id \
                     AND {{steps}}.run_id = ? AND {{steps}}.idx = ? AND {{steps}}.status IN {{unfinished}} \
                     RETURNING {{steps}}.idx",
                    with(renew)
                ))
            };
            std::array::from_fn(|v| [insert(&renews[v]), finish(&renews[v])])
        });
        // SQLite and MySQL: the row's write guarded by the run's row. On SQLite the write lock is
        // held from BEGIN IMMEDIATE or the statement's start. On MySQL the run's row is read
        // with a shared lock: a plain read in a READ COMMITTED session (Courier's) is a
        // snapshot that does not wait for another worker's uncommitted takeover of the run.
        let alone = (dialect != Dialect::Postgres).then(|| {
            let (from, lock, returning) = match dialect {
                Dialect::Mysql => (" FROM DUAL", " LOCK IN SHARE MODE", ""),
                _ => ("", "", " RETURNING idx"),
            };
            std::array::from_fn(|owned| {
                let owner = if owned == 1 { "= ?" } else { "IS NULL" };
                let guard = format!(
                    "EXISTS (SELECT 1 FROM {{runs}} WHERE id = ? AND status = 'running' AND claimed_by {owner}{lock})"
                );
                [
                    format!(
                        "INSERT INTO {{steps}} ({{step_cols}}) SELECT ?, {insert_values}{from} WHERE {guard}{returning}"
                    ),
                    format!(
                        "UPDATE {{steps}} SET {finish_set} WHERE run_id = ? AND idx = ? \
                         AND status IN {{unfinished}} AND {guard}{returning}"
                    ),
                ]
            })
        });
        // SQLite: then the renew and the usage, only when the row was written (`changes()` of
        // the statement before).
        let script = alone
            .as_ref()
            .filter(|_| dialect == Dialect::Sqlite)
            .map(|alone: &[[String; 2]; 2]| {
                std::array::from_fn(|v| {
                    let (owned, counted) = (v & 1 == 1, v & 2 == 2);
                    let lease = if owned { RENEW_IF } else { "" };
                    let add = if counted { add } else { "" };
                    let renew = format!(
                        "UPDATE {{runs}} SET {lease}{add}updated_at = {{now}} WHERE id = ? AND changes() = 1"
                    );
                    // The combiner wraps it in BEGIN IMMEDIATE ... COMMIT, with other writes or alone.
                    let owned = usize::from(owned);
                    [0, 1].map(|mode| render(&format!("{}; {renew}", alone[owned][mode])))
                })
            });
        let alone = alone.map(|alone| alone.map(|modes| modes.map(|sql| render(&sql))));
        let suspend = "UPDATE {runs} SET status = 'waiting', claimed_by = NULL, lease_expires = 0, due_at = ?, \
            wait_signal = ?, updated_at = {now} WHERE id = ? AND status = 'running' AND claimed_by";
        let wake = "UPDATE {runs} SET status = 'queued', due_at = {now}, wait_signal = NULL, updated_at = {now} \
            WHERE id = ? AND status = 'waiting' AND";
        Self {
            renew: std::array::from_fn(|v| render(&renews[v])),
            script,
            alone,
            insert_step: render(&insert_step),
            finish_step: render(&finish_step),
            cte,
            steps: render("SELECT {step_cols} FROM {steps} WHERE run_id = ? ORDER BY idx"),
            suspend_owned: render(&format!("{suspend} = ?")),
            suspend_interactive: render(&format!("{suspend} IS NULL")),
            select_due_waits: render(
                "SELECT {cols} FROM {runs} WHERE status = 'waiting' AND due_at <= {now} ORDER BY due_at LIMIT ?",
            ),
            wake_due: render(&format!("{wake} due_at <= {{now}}")),
            wake_signal: render(&format!("{wake} wait_signal = ?")),
            release_parked: render(
                "UPDATE {runs} SET status = 'queued', due_at = {now}, claimed_by = NULL, lease_expires = 0, \
                 pending_effect = NULL, updated_at = {now} WHERE id = ? AND status = 'waiting_for_approval'",
            ),
            copy_steps: render(
                "INSERT INTO {steps} ({step_cols}) SELECT ?, idx, name, effect, status, output, error, error_class, \
                 step_usage, duration_ms, attempts, {now}, finished_at FROM {steps} \
                 WHERE run_id = ? AND idx < ? AND status = 'done'",
            ),
            resolve_step: render(
                "UPDATE {steps} SET status = ?, output = ?, finished_at = CASE WHEN ? = 1 THEN {now} ELSE NULL END \
                 WHERE run_id = ? AND idx = ? AND status = 'intent'",
            ),
        }
    }
}

pub(super) fn is_finished(status: StepStatus) -> i64 {
    i64::from(matches!(status, StepStatus::Done | StepStatus::Failed))
}

pub(super) fn usage_json(usage: &Usage) -> Option<serde_json::Value> {
    (!usage.is_zero()).then(|| serde_json::to_value(usage).unwrap_or_default())
}

impl<DB> Runs<DB>
where
    DB: RunDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> serde_json::Value: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<&'q str>: sqlx::Encode<'q, DB>,
    for<'q> Option<serde_json::Value>: sqlx::Encode<'q, DB>,
    for<'r> Run: sqlx::FromRow<'r, DB::Row>,
    for<'r> String: sqlx::Decode<'r, DB>,
    for<'r> i64: sqlx::Decode<'r, DB>,
    for<'r> serde_json::Value: sqlx::Decode<'r, DB>,
    for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
{
    pub(super) async fn select_steps(&self, id: Uuid) -> Result<Vec<StepRecord>, StoreError> {
        let rows = sqlx::query(&self.sq.steps)
            .bind(DB::id(id))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("read the step journal"))?;
        rows.iter()
            .map(|row| {
                let index: i64 = column(row, "idx")?;
                let bad = |what: &str, e: &dyn std::fmt::Display| {
                    StoreError::Corrupt(format!("step {index} of run {id}: column `{what}`: {e}"))
                };
                let status: String = column(row, "status")?;
                let usage: Option<serde_json::Value> =
                    column(row, "step_usage").map_err(|e| bad("step_usage", &e))?;
                Ok(StepRecord {
                    run_id: id,
                    index,
                    name: column(row, "name")?,
                    effect: column(row, "effect")?,
                    status: StepStatus::parse(&status)
                        .ok_or_else(|| bad("status", &format!("unknown status `{status}`")))?,
                    output: column(row, "output").map_err(|e| bad("output", &e))?,
                    error: column(row, "error")?,
                    error_class: column(row, "error_class")?,
                    usage: usage
                        .map(serde_json::from_value)
                        .transpose()
                        .map_err(|e| bad("step_usage", &e))?
                        .unwrap_or_default(),
                    duration_ms: column(row, "duration_ms")?,
                    attempts: column(row, "attempts")?,
                    created_at: column(row, "created_at")?,
                    finished_at: column(row, "finished_at")?,
                })
            })
            .collect()
    }

    pub(super) async fn suspend_run(
        &self,
        id: Uuid,
        owner: Option<&str>,
        until: i64,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = if owner.is_some() {
            &self.sq.suspend_owned
        } else {
            &self.sq.suspend_interactive
        };
        let mut q = sqlx::query(sql).bind(until).bind(signal).bind(DB::id(id));
        if let Some(owner) = owner {
            q = q.bind(owner);
        }
        let done = in_flight(q.execute(&self.pool))
            .await
            .map_err(db("suspend run"))?;
        Ok(DB::rows_affected(&done) > 0)
    }

    pub(super) async fn due_waits(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as(&self.sq.select_due_waits)
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("select due waits"))
    }

    pub(super) async fn wake_run(
        &self,
        id: Uuid,
        signal: Option<&str>,
    ) -> Result<bool, StoreError> {
        let done = match signal {
            None => sqlx::query(&self.sq.wake_due).bind(DB::id(id)),
            Some(name) => sqlx::query(&self.sq.wake_signal)
                .bind(DB::id(id))
                .bind(name),
        }
        .execute(&self.pool)
        .await
        .map_err(db("wake run"))?;
        Ok(DB::rows_affected(&done) > 0)
    }

    pub(super) async fn release_parked_run(&self, id: Uuid) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sq.release_parked)
            .bind(DB::id(id))
            .execute(&self.pool)
            .await
            .map_err(db("release parked run"))?;
        Ok(DB::rows_affected(&done) > 0)
    }

    pub(super) async fn prune_runs(
        &self,
        older_than: Duration,
        statuses: &[RunStatus],
        limit: usize,
    ) -> Result<u64, StoreError> {
        let statuses: Vec<&str> = statuses
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| s.as_str())
            .collect();
        let limit = limit.clamp(1, MAX_PRUNE_BATCH);
        if statuses.is_empty() {
            return Ok(0);
        }
        // Status names are the enum's own constants, never outside input.
        let list = statuses
            .iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let runs = self.runs.as_str();
        let dialect = DB::DIALECT;
        let select = dialect.render(&format!(
            "SELECT id FROM {runs} WHERE status IN ({list}) AND finished_at < {{now}} - ? \
             ORDER BY finished_at LIMIT ?"
        ));
        let rows = sqlx::query(&select)
            .bind(lease_ms(older_than))
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(db("select runs to prune"))?;
        let ids = rows
            .iter()
            .map(|row| column::<_, DB::Id>(row, "id").map(DB::uuid))
            .collect::<Result<Vec<Uuid>, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        let marks = vec!["?"; ids.len()].join(", ");
        let delete = |table: &str, col: &str, guard: &str| {
            dialect.render(&format!(
                "DELETE FROM {table} WHERE {col} IN ({marks}){guard}"
            ))
        };
        let guard = format!(" AND status IN ({list})");
        let statements = [
            delete(&self.events, "run_id", ""),
            delete(&format!("{runs}_steps"), "run_id", ""),
            delete(runs, "id", &guard),
        ];
        let prune = async {
            let mut tx = self.pool.begin().await?;
            let mut deleted = 0;
            for sql in &statements {
                let mut q = sqlx::query(sql);
                for id in &ids {
                    q = q.bind(DB::id(*id));
                }
                deleted = DB::rows_affected(&q.execute(&mut *tx).await?);
            }
            tx.commit().await?;
            Ok::<u64, sqlx::Error>(deleted)
        };
        prune.await.map_err(db("prune runs"))
    }

    pub(super) async fn copy_journal(
        &self,
        from: Uuid,
        to: Uuid,
        before: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.sq.copy_steps)
            .bind(DB::id(to))
            .bind(DB::id(from))
            .bind(before)
            .execute(&self.pool)
            .await
            .map_err(db("copy steps"))?;
        Ok(DB::rows_affected(&done))
    }

    pub(super) async fn resolve_parked_step(
        &self,
        id: Uuid,
        index: i64,
        status: StepStatus,
        output: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.sq.resolve_step)
            .bind(status.as_str())
            .bind(output.cloned())
            .bind(is_finished(status))
            .bind(DB::id(id))
            .bind(index)
            .execute(&self.pool)
            .await
            .map_err(db("resolve step"))?;
        Ok(DB::rows_affected(&done) > 0)
    }
}
