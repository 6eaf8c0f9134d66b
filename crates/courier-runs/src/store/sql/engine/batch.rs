//! PostgreSQL: the hot writes of concurrent runs (claims, journaled steps, settles) ride one
//! statement per kind, their values bound as arrays and joined back with `unnest`.
//!
//! A worker holding many runs sends each run's claim, step and settle as its own guarded
//! statement; on PostgreSQL each statement is a round trip, a commit and a trip through the
//! executor, and that is where a busy run store spends its CPU. Here a write queues; the first
//! writer to find no batch of its kind in flight sends every queued write of that kind in one
//! statement (`UPDATE ... FROM unnest($1::uuid[], ...) AS b(...) WHERE id = b.id AND <guard>
//! RETURNING ...`), and keeps sending what queued meanwhile until the queue is empty; each
//! write reads its own answer from the rows returned. An idle store writes alone, as before:
//! nothing waits for a batch to fill.
//!
//! Each write keeps its own guard, evaluated on its own row: a batch changes what a write
//! costs, not what it may do. A run appears at most once in a batch (a second write of the same
//! run waits for the next one), so that no row is matched twice. A batch that fails (a
//! constraint one write broke, a lost connection) answers every write with [`Alone`], and each
//! writer then sends its own statement, as an unbatched store does, so that only the write that
//! fails gets the error. The batch runs in a task of its own: a caller that stops waiting
//! cannot leave the others' writes half done.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use sqlx::postgres::{PgPool, PgRow};
use tokio::sync::{Semaphore, oneshot};
use uuid::Uuid;

use super::row::{column, decode_run};
use crate::step::{JournalMode, StepWrite};
use crate::store::{Run, Settlement};

/// The most writes one statement takes.
const MAX_BATCH: usize = 256;
/// Batches of one kind in flight at once.
const PARALLEL: usize = 4;

/// The batch of a write failed as a whole: the writer sends its own statement.
#[derive(Debug)]
pub(in crate::store::sql) struct Alone;

/// A write that can ride a batch: the run it writes.
trait Keyed: Send + 'static {
    fn run_id(&self) -> Uuid;
}

type Reply<O> = oneshot::Sender<Result<O, Alone>>;
/// Writes waiting for a batch, each with where its answer goes.
type Queue<I, O> = Arc<Mutex<Vec<(I, Reply<O>)>>>;
type Flush<I, O> =
    fn(Arc<Shared>, Vec<I>) -> Pin<Box<dyn Future<Output = Result<Vec<O>, sqlx::Error>> + Send>>;

/// The queue of one kind of write, and its turn.
struct Batcher<I, O> {
    queue: Queue<I, O>,
    /// Held by the task sending this kind's batches.
    turn: Arc<Semaphore>,
    flush: Flush<I, O>,
}

impl<I: Keyed, O: Send + 'static> Batcher<I, O> {
    fn new(flush: Flush<I, O>) -> Self {
        Self {
            queue: Arc::default(),
            turn: Arc::new(Semaphore::new(PARALLEL)),
            flush,
        }
    }

    /// Writes `item` in a batch: its answer, or [`Alone`].
    async fn write(&self, shared: &Arc<Shared>, item: I) -> Result<O, Alone> {
        let (reply, done) = oneshot::channel();
        lock(&self.queue).push((item, reply));
        // Either a task sending batches holds the turn and takes this write with its next
        // batch, or this writer gets the turn and starts one. A task sends until it finds the
        // queue empty, and a write queued after that looks for the turn itself.
        if let Ok(turn) = self.turn.clone().acquire_owned().await
            && !lock(&self.queue).is_empty()
        {
            let (queue, flush, shared) = (self.queue.clone(), self.flush, shared.clone());
            tokio::spawn(async move {
                loop {
                    let batch = take(&queue);
                    if batch.is_empty() {
                        break;
                    }
                    send(&shared, flush, batch).await;
                }
                drop(turn);
            });
        }
        done.await.unwrap_or(Err(Alone))
    }
}

/// Up to [`MAX_BATCH`] queued writes, at most one per run, in the order they queued.
fn take<I: Keyed, O>(queue: &Mutex<Vec<(I, Reply<O>)>>) -> Vec<(I, Reply<O>)> {
    let mut queue = lock(queue);
    let mut runs = HashSet::new();
    let mut batch = Vec::new();
    let mut left = Vec::new();
    for queued in queue.drain(..) {
        if batch.len() < MAX_BATCH && runs.insert(queued.0.run_id()) {
            batch.push(queued);
        } else {
            left.push(queued);
        }
    }
    *queue = left;
    // Rows are locked in the order of their ids, as every batch locks them.
    batch.sort_by_key(|queued| queued.0.run_id());
    batch
}

async fn send<I, O>(shared: &Arc<Shared>, flush: Flush<I, O>, batch: Vec<(I, Reply<O>)>) {
    let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
    let n = items.len();
    #[cfg(test)]
    if n > 1 {
        tests::SHARED.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
    match flush(shared.clone(), items).await {
        Ok(answers) if answers.len() == n => {
            shared.counter.add(n, 1);
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(_) | Err(_) => {
            for reply in replies {
                let _ = reply.send(Err(Alone));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A guarded claim: run, worker, lease (ms).
struct Claim(Uuid, String, i64);

impl Keyed for Claim {
    fn run_id(&self) -> Uuid {
        self.0
    }
}

/// A journaled step: run, owner, lease (ms), the write.
struct Journal(Uuid, Option<String>, i64, StepWrite);

impl Keyed for Journal {
    fn run_id(&self) -> Uuid {
        self.0
    }
}

/// A guarded settle: run, owner, settlement.
struct Settle(Uuid, Option<String>, Settlement);

impl Keyed for Settle {
    fn run_id(&self) -> Uuid {
        self.0
    }
}

/// The pool and the batched statements, shared with the tasks sending batches.
struct Shared {
    pool: PgPool,
    counter: Arc<crate::store::sql::WriteCounter>,
    claim: String,
    /// Per [`JournalMode`]: insert, finish.
    journal: [String; 2],
    settle: String,
}

/// The batched writes of one store.
pub(in crate::store::sql) struct Batches {
    shared: Arc<Shared>,
    claims: Batcher<Claim, Option<Run>>,
    /// Per [`JournalMode`]: insert, finish.
    journals: [Batcher<Journal, bool>; 2],
    settles: Batcher<Settle, bool>,
}

impl std::fmt::Debug for Batches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches").finish_non_exhaustive()
    }
}

fn mode(m: JournalMode) -> usize {
    usize::from(m == JournalMode::Finish)
}

impl Batches {
    /// The batched statements on the run table `runs` (its steps in `<runs>_steps`).
    pub(in crate::store::sql) fn new(
        pool: PgPool,
        runs: &str,
        counter: Arc<crate::store::sql::WriteCounter>,
    ) -> Self {
        let steps = format!("{runs}_steps");
        let render = |sql: &str| {
            courier_sql::Dialect::Postgres.render(
                &sql.replace("{steps}", &steps)
                    .replace("{runs}", runs)
                    .replace("{cols}", super::super::queries::COLUMNS),
            )
        };
        let claim = render(
            "UPDATE {runs} SET status = 'running', claimed_by = b.worker, lease_expires = {now} + b.lease, \
             started_at = COALESCE(started_at, {now}), updated_at = {now} \
             FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS b(run, worker, lease) \
             WHERE {runs}.id = b.run AND {runs}.id = ANY($1) AND ({runs}.status = 'queued') IS TRUE \
             RETURNING {cols}, CAST(CASE WHEN EXISTS (SELECT 1 FROM {steps} WHERE run_id = {runs}.id) \
             THEN 1 ELSE 0 END AS BIGINT) AS has_steps",
        );
        // The renew of each run (its lease when owned, its usage and replays), then its step's
        // row, written only for the runs whose renew matched.
        let input = format!(
            "b AS (SELECT * FROM unnest({}) AS t({}))",
            "$1::uuid[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::text[], $13::text[], $14::text[], $15::jsonb[], $16::text[], $17::text[], $18::jsonb[], $19::bigint[], $20::bigint[]",
            "run, owner, below, lease, tin, tout, cost, tools, turns, replayed, idx, sname, seffect, sstatus, soutput, serror, sclass, susage, sduration, sfinished"
        );
        let renew = "run AS (UPDATE {runs} SET \
             lease_expires = CASE WHEN b.owner IS NULL OR {runs}.lease_expires >= {now} + b.below \
             THEN {runs}.lease_expires ELSE {now} + b.lease END, \
             used_tokens_in = used_tokens_in + b.tin, used_tokens_out = used_tokens_out + b.tout, \
             used_cost = used_cost + b.cost, used_tool_calls = used_tool_calls + b.tools, \
             used_turns = used_turns + b.turns, steps_replayed = steps_replayed + b.replayed, \
             updated_at = {now} FROM b WHERE {runs}.id = b.run AND {runs}.id = ANY($1) \
             AND ({runs}.status = 'running') IS TRUE AND {runs}.claimed_by IS NOT DISTINCT FROM b.owner RETURNING {runs}.id)";
        let insert = render(&format!(
            "WITH {input}, {renew} INSERT INTO {{steps}} (run_id, idx, name, effect, status, output, error, \
             error_class, step_usage, duration_ms, attempts, created_at, finished_at) \
             SELECT b.run, b.idx, b.sname, b.seffect, b.sstatus, b.soutput, b.serror, b.sclass, b.susage, \
             b.sduration, b.sfinished, {{now}}, CASE WHEN b.sfinished = 1 THEN {{now}} ELSE NULL END \
             FROM b JOIN run ON run.id = b.run RETURNING run_id"
        ));
        let finish = render(&format!(
            "WITH {input}, {renew} UPDATE {{steps}} SET status = b.sstatus, output = b.soutput, \
             error = b.serror, error_class = b.sclass, step_usage = b.susage, duration_ms = b.sduration, \
             attempts = {{steps}}.attempts + 1, \
             finished_at = CASE WHEN b.sfinished = 1 THEN {{now}} ELSE NULL END \
             FROM b JOIN run ON run.id = b.run WHERE {{steps}}.run_id = b.run AND {{steps}}.idx = b.idx \
             AND {{steps}}.status IN ('intent', 'retry', 'waiting') RETURNING {{steps}}.run_id"
        ));
        let settle = render(
            "UPDATE {runs} SET status = b.status, termination_reason = b.reason, error_class = b.class, \
             output = COALESCE(b.output, {runs}.output), lease_expires = 0, \
             finished_at = CASE WHEN b.terminal = 1 THEN {now} ELSE {runs}.finished_at END, updated_at = {now} \
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::bigint[]) \
             AS b(run, owner, status, reason, class, output, terminal) \
             WHERE {runs}.id = b.run AND {runs}.id = ANY($1) \
             AND ({runs}.status IN ('queued', 'running', 'waiting_for_approval', 'waiting_for_input', 'waiting')) IS TRUE \
             AND {runs}.claimed_by IS NOT DISTINCT FROM b.owner RETURNING {runs}.id",
        );
        Self {
            shared: Arc::new(Shared {
                pool,
                counter,
                claim,
                journal: [insert, finish],
                settle,
            }),
            claims: Batcher::new(|shared, items| Box::pin(claims(shared, items))),
            journals: [
                Batcher::new(|shared, items| Box::pin(journals(shared, items, 0))),
                Batcher::new(|shared, items| Box::pin(journals(shared, items, 1))),
            ],
            settles: Batcher::new(|shared, items| Box::pin(settles(shared, items))),
        }
    }

    /// [`RunStore::claim`](crate::RunStore::claim), batched: the row claimed, if the guard
    /// matched.
    pub(in crate::store::sql) async fn claim(
        &self,
        id: Uuid,
        worker: &str,
        lease_ms: i64,
    ) -> Result<Option<Run>, Alone> {
        self.claims
            .write(&self.shared, Claim(id, worker.to_owned(), lease_ms))
            .await
    }

    /// [`RunStore::journal`](crate::RunStore::journal), batched: whether the guard matched.
    pub(in crate::store::sql) async fn journal(
        &self,
        id: Uuid,
        owner: Option<&str>,
        lease_ms: i64,
        w: &StepWrite,
    ) -> Result<bool, Alone> {
        let item = Journal(id, owner.map(str::to_owned), lease_ms, w.clone());
        self.journals[mode(w.mode)].write(&self.shared, item).await
    }

    /// [`RunStore::settle`](crate::RunStore::settle), batched: whether the guard matched.
    pub(in crate::store::sql) async fn settle(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, Alone> {
        let item = Settle(id, owner.map(str::to_owned), s.clone());
        self.settles.write(&self.shared, item).await
    }
}

/// The runs the rows name (`column`).
fn returned(rows: &[PgRow], col: &str) -> Result<HashSet<Uuid>, sqlx::Error> {
    rows.iter()
        .map(|row| column::<_, Uuid>(row, col).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .collect()
}

async fn claims(shared: Arc<Shared>, items: Vec<Claim>) -> Result<Vec<Option<Run>>, sqlx::Error> {
    let ids: Vec<Uuid> = items.iter().map(|c| c.0).collect();
    let workers: Vec<&str> = items.iter().map(|c| c.1.as_str()).collect();
    let leases: Vec<i64> = items.iter().map(|c| c.2).collect();
    let rows = sqlx::query(&shared.claim)
        .bind(&ids)
        .bind(&workers)
        .bind(&leases)
        .fetch_all(&shared.pool)
        .await?;
    let mut claimed = HashMap::with_capacity(rows.len());
    for row in &rows {
        let run = decode_run(row).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        claimed.insert(run.id, run);
    }
    Ok(ids.iter().map(|id| claimed.remove(id)).collect())
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn journals(
    shared: Arc<Shared>,
    items: Vec<Journal>,
    mode: usize,
) -> Result<Vec<bool>, sqlx::Error> {
    let ids: Vec<Uuid> = items.iter().map(|j| j.0).collect();
    let ws = || items.iter().map(|j| &j.3);
    let usage = |f: fn(&StepWrite) -> u64| ws().map(|w| count(f(w))).collect::<Vec<i64>>();
    let rows = sqlx::query(&shared.journal[mode])
        .bind(&ids)
        .bind(items.iter().map(|j| j.1.as_deref()).collect::<Vec<_>>())
        .bind(items.iter().map(|j| j.2 - j.2 / 4).collect::<Vec<i64>>())
        .bind(items.iter().map(|j| j.2).collect::<Vec<i64>>())
        .bind(usage(|w| w.usage.tokens_in))
        .bind(usage(|w| w.usage.tokens_out))
        .bind(usage(|w| w.usage.cost_micros))
        .bind(usage(|w| w.usage.tool_calls))
        .bind(usage(|w| w.usage.turns))
        .bind(usage(|w| w.replayed))
        .bind(ws().map(|w| w.index).collect::<Vec<i64>>())
        .bind(ws().map(|w| w.name.as_str()).collect::<Vec<_>>())
        .bind(ws().map(|w| w.effect).collect::<Vec<_>>())
        .bind(ws().map(|w| w.status.as_str()).collect::<Vec<_>>())
        .bind(ws().map(|w| w.output.clone()).collect::<Vec<_>>())
        .bind(ws().map(|w| w.error.as_deref()).collect::<Vec<_>>())
        .bind(ws().map(|w| w.error_class.as_deref()).collect::<Vec<_>>())
        .bind(
            ws().map(|w| super::steps::usage_json(&w.usage))
                .collect::<Vec<_>>(),
        )
        .bind(ws().map(|w| w.duration_ms).collect::<Vec<i64>>())
        .bind(
            ws().map(|w| super::steps::is_finished(w.status))
                .collect::<Vec<i64>>(),
        )
        .fetch_all(&shared.pool)
        .await?;
    let written = returned(&rows, "run_id")?;
    Ok(ids.iter().map(|id| written.contains(id)).collect())
}

async fn settles(shared: Arc<Shared>, items: Vec<Settle>) -> Result<Vec<bool>, sqlx::Error> {
    let ids: Vec<Uuid> = items.iter().map(|s| s.0).collect();
    let ss = || items.iter().map(|s| &s.2);
    let rows = sqlx::query(&shared.settle)
        .bind(&ids)
        .bind(items.iter().map(|s| s.1.as_deref()).collect::<Vec<_>>())
        .bind(ss().map(|s| s.status.as_str()).collect::<Vec<_>>())
        .bind(
            ss().map(|s| s.reason.map(|r| r.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            ss().map(|s| s.class.map(|c| c.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(ss().map(|s| s.output.clone()).collect::<Vec<_>>())
        .bind(
            ss().map(|s| i64::from(s.status.is_terminal()))
                .collect::<Vec<i64>>(),
        )
        .fetch_all(&shared.pool)
        .await?;
    let settled = returned(&rows, "id")?;
    Ok(ids.iter().map(|id| settled.contains(id)).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::{NewRun, RunStore as _, SqlRunStore, SqlRunStoreOptions, StepStatus, Usage};

    /// Writes that shared a statement with another, so far.
    pub(super) static SHARED: AtomicUsize = AtomicUsize::new(0);

    /// 40 runs journaling a step at once share statements, and each write is answered: the
    /// step rows and the usage are all there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL (scripts/services)"]
    async fn concurrent_steps_of_many_runs_share_statements() {
        let prefix = format!("batch_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let options = SqlRunStoreOptions::default().table_prefix(&prefix);
        let store = SqlRunStore::connect(&courier_test::env::postgres_url(), options)
            .await
            .unwrap();
        store.setup().await.unwrap();
        let store = std::sync::Arc::new(store);
        let lease = Duration::from_secs(900);
        let mut ids = Vec::new();
        for _ in 0..40 {
            let run = store
                .insert_queued(&NewRun::new("n", serde_json::json!({})))
                .await
                .unwrap();
            store.claim(run.id, "w", lease).await.unwrap().unwrap();
            ids.push(run.id);
        }
        let before = SHARED.load(Ordering::Relaxed);
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ids.len()));
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (store, barrier) = (store.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let w = crate::StepWrite {
                        mode: crate::JournalMode::Insert,
                        index: 1,
                        name: "one".into(),
                        effect: "pure",
                        status: StepStatus::Done,
                        output: Some(serde_json::json!(id.to_string())),
                        error: None,
                        error_class: None,
                        usage: Usage::tokens(0, 5),
                        duration_ms: 1,
                        replayed: 0,
                    };
                    store.journal(id, Some("w"), lease, &w).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        let shared = SHARED.load(Ordering::Relaxed) - before;
        let mut stored = Vec::new();
        for &id in &ids {
            let steps = store.steps(id).await.unwrap();
            let run = store.find(id).await.unwrap().unwrap();
            let output = steps.first().and_then(|s| s.output.clone());
            stored.push((steps.len(), output, run.usage.tokens_out));
        }
        store.drop_tables().await.unwrap();
        assert!(answers.iter().all(|a| matches!(a, Ok(true))), "{answers:?}");
        for (id, row) in ids.iter().zip(stored) {
            assert_eq!(row, (1, Some(serde_json::json!(id.to_string())), 5), "{id}");
        }
        assert!(shared > 0, "no two steps shared a statement");
    }
}
