//! SQLite: the hot writes of concurrent runs (claims, journaled steps, settles) share one
//! transaction.
//!
//! SQLite has one writer, so this store's writes take turns anyway, on the file's turn that the
//! message table's writes take too (`courier_sql::sqlite_write_turn`). Here a
//! write that finds the turn taken waits in a queue; the next writer to get the turn takes
//! every queued write with it, in order: `BEGIN IMMEDIATE`, each write's statements with its
//! values, `COMMIT`, one hop to the connection's thread per write (the first carries the
//! `BEGIN`, the last the `COMMIT`) and one commit for all of them, each write's rows and
//! changes handed back to its caller. Each hop's statements are the same string for every
//! write of its kind, so SQLite compiles them once per connection. An idle store writes alone,
//! as before (one hop): nothing waits for a batch to fill.
//!
//! Each write keeps its own guard (its statements' `WHERE`), so a batch changes what a write
//! costs, not what it may do. A batch that fails (one write's constraint, a busy database) is
//! rolled back and its writes are run again one transaction each, so that only the write that
//! failed gets the error. The batch runs in a task of its own: a caller that stops waiting
//! cannot leave the others' writes half done.

use std::sync::{Arc, Mutex, PoisonError};

use futures_util::TryStreamExt as _;
use sqlx::Either;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use tokio::sync::oneshot;

/// The most writes one transaction takes (a script's values stay well under SQLite's
/// 32,766 bound parameters).
const MAX_BATCH: usize = 64;

/// A value bound to a write's statements.
#[derive(Debug, Clone)]
pub(in crate::store::sql) enum Bind {
    Int(i64),
    Text(String),
    OptText(Option<String>),
    OptJson(Option<serde_json::Value>),
}

/// One write: statements separated by `;`, without `BEGIN` / `COMMIT`, and their values.
#[derive(Debug)]
pub(in crate::store::sql) struct Write {
    pub(in crate::store::sql) sql: String,
    pub(in crate::store::sql) statements: usize,
    pub(in crate::store::sql) binds: Vec<Bind>,
}

/// What each statement of a write returned: its rows and its `changes()`.
#[derive(Default)]
pub(in crate::store::sql) struct Written {
    pub(in crate::store::sql) rows: Vec<Vec<SqliteRow>>,
    pub(in crate::store::sql) changes: Vec<u64>,
}

type Reply = oneshot::Sender<Result<Written, sqlx::Error>>;

/// The queue and the turn of one store's writes.
pub(in crate::store::sql) struct Combiner {
    pool: SqlitePool,
    /// Writes that shared a transaction with another, so far (read by the tests).
    #[cfg(test)]
    shared: Arc<std::sync::atomic::AtomicUsize>,
    queue: Arc<Mutex<Vec<(Write, Reply)>>>,
    turn: Arc<tokio::sync::Mutex<()>>,
    counter: Arc<crate::store::sql::WriteCounter>,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner")
            .field("queued", &lock(&self.queue).len())
            .finish_non_exhaustive()
    }
}

impl Combiner {
    /// Writes through `pool`, taking turns with every other writer of its file in this process
    /// ([`courier_sql::sqlite_write_turn`]).
    pub(in crate::store::sql) fn new(
        pool: SqlitePool,
        counter: Arc<crate::store::sql::WriteCounter>,
    ) -> Self {
        Self {
            counter,
            turn: courier_sql::sqlite_write_turn(&pool),
            pool,
            #[cfg(test)]
            shared: Arc::default(),
            queue: Arc::default(),
        }
    }

    /// The turn every other write of the store takes (schema changes, the cold paths), so that
    /// they never run beside a batch.
    pub(in crate::store::sql) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// Writes `write`, alone or with the writes queued beside it.
    pub(in crate::store::sql) async fn write(&self, write: Write) -> Result<Written, sqlx::Error> {
        let (reply, mut done) = oneshot::channel();
        lock(&self.queue).push((write, reply));
        let turn = self.turn.clone().lock_owned().await;
        // The writer before us may have taken ours.
        match done.try_recv() {
            Ok(result) => return result,
            Err(oneshot::error::TryRecvError::Closed) => return Err(sqlx::Error::WorkerCrashed),
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let batch: Vec<(Write, Reply)> = {
            let mut queue = lock(&self.queue);
            let n = queue.len().min(MAX_BATCH);
            queue.drain(..n).collect()
        };
        #[cfg(test)]
        if batch.len() > 1 {
            self.shared
                .fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed);
        }
        let pool = self.pool.clone();
        let statements = match batch.as_slice() {
            [(w, _)] if w.statements == 1 => 1,
            _ => 2 + batch.iter().map(|(w, _)| w.statements).sum::<usize>(),
        };
        self.counter.add(batch.len(), statements);
        tokio::spawn(async move {
            run(&pool, batch).await;
            drop(turn);
        });
        done.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `batch` in one transaction, or, when that fails, each write in one of its own.
async fn run(pool: &SqlitePool, batch: Vec<(Write, Reply)>) {
    if batch.len() > 1 {
        let writes: Vec<&Write> = batch.iter().map(|(w, _)| w).collect();
        if let Ok(mut results) = transaction(pool, &writes).await {
            for ((_, reply), written) in batch.into_iter().zip(results.drain(..)) {
                let _ = reply.send(Ok(written));
            }
            return;
        }
    }
    for (write, reply) in batch {
        let result = transaction(pool, &[&write]).await.map(|mut r| r.remove(0));
        let _ = reply.send(result);
    }
}

/// `writes` in one transaction: what each returned, in order.
///
/// `BEGIN IMMEDIATE`, each write's statements with its values, `COMMIT`, on one connection, one
/// hop to the connection's thread per write: the first write carries the `BEGIN`, the last the
/// `COMMIT`. Each of those strings is the same for every write of its kind, so SQLite compiles
/// it once per connection; a script joining a whole batch would be a new string each time,
/// parsed and compiled on every batch (that cost more than the rest of the writes together).
async fn transaction(pool: &SqlitePool, writes: &[&Write]) -> Result<Vec<Written>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut results: Vec<Written> = Vec::with_capacity(writes.len());
    let last = writes.len().saturating_sub(1);
    let mut failed = None;
    for (i, w) in writes.iter().enumerate() {
        match statements(&mut conn, w, i == 0, i == last).await {
            Ok(written) => results.push(written),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    match failed {
        None => Ok(results),
        Some(e) => {
            // A statement failed after BEGIN: roll back on this connection before it returns
            // to the pool (an error of its own means no transaction was open, or a connection
            // to drop).
            if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
                drop(conn.detach());
            }
            Err(e)
        }
    }
}

/// One write's statements on `conn`, after `BEGIN IMMEDIATE` when `begin` and before `COMMIT`
/// when `commit`: each of its own statements' rows and changes.
async fn statements(
    conn: &mut sqlx::pool::PoolConnection<sqlx::Sqlite>,
    w: &Write,
    begin: bool,
    commit: bool,
) -> Result<Written, sqlx::Error> {
    let sql = format!(
        "{}{}{}",
        if begin { "BEGIN IMMEDIATE; " } else { "" },
        w.sql,
        if commit { "; COMMIT" } else { "" }
    );
    let mut q = sqlx::query(&sql);
    for b in &w.binds {
        q = match b {
            Bind::Int(v) => q.bind(*v),
            Bind::Text(v) => q.bind(v.as_str()),
            Bind::OptText(v) => q.bind(v.as_deref()),
            Bind::OptJson(v) => q.bind(v.clone()),
        };
    }
    // A prepared script of several statements, each answered in turn (`Left` ends one): what
    // sqlx's SQLite driver does and `raw_sql` cannot (it binds no values).
    #[allow(
        deprecated,
        reason = "SQLite runs a multi-statement script with its values bound"
    )]
    let mut stream = q.fetch_many(&mut **conn);
    let mut written = Written::default();
    let mut rows: Vec<SqliteRow> = Vec::new();
    let mut answered = 0_usize;
    while let Some(item) = stream.try_next().await? {
        match item {
            Either::Right(row) => rows.push(row),
            Either::Left(done) => {
                let own = answered.checked_sub(usize::from(begin));
                answered += 1;
                // BEGIN and COMMIT answer nothing of the write's.
                if own.is_some_and(|n| n < w.statements) {
                    written.rows.push(std::mem::take(&mut rows));
                    written.changes.push(done.rows_affected());
                } else {
                    rows.clear();
                }
            }
        }
    }
    let expected = w.statements + usize::from(begin) + usize::from(commit);
    if answered != expected {
        return Err(sqlx::Error::Protocol(format!(
            "a write of {expected} statements answered {answered}"
        )));
    }
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// 40 concurrent writes, one of which breaks a constraint: they share transactions, the
    /// one that fails gets its error, every other is written and answers its own rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_transactions_and_only_the_failing_one_fails() {
        let pool =
            courier_sql::sqlite_pool("sqlite::memory:", &courier_sql::PoolSettings::default())
                .await
                .unwrap();
        sqlx::query("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO t (k, v) VALUES (7, 'taken')")
            .execute(&pool)
            .await
            .unwrap();
        let combiner = Arc::new(Combiner::new(pool.clone(), Arc::default()));
        let barrier = Arc::new(tokio::sync::Barrier::new(40));
        let tasks: Vec<_> = (0..40_i64)
            .map(|i| {
                let (combiner, barrier) = (combiner.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    // Key 7 is taken: that insert breaks the primary key.
                    let k = if i == 7 { 7 } else { 100 + i };
                    combiner
                        .write(Write {
                            sql: "INSERT INTO t (k, v) VALUES (?, ?) RETURNING k; \
                                  UPDATE t SET v = v || '!' WHERE k = ? AND changes() = 1"
                                .to_owned(),
                            statements: 2,
                            binds: vec![Bind::Int(k), Bind::Text(format!("v{i}")), Bind::Int(k)],
                        })
                        .await
                })
            })
            .collect();
        for (i, task) in tasks.into_iter().enumerate() {
            let result = task.await.unwrap();
            if i == 7 {
                assert!(result.is_err(), "the insert of a taken key fails");
                continue;
            }
            let written = result.unwrap();
            assert_eq!(written.rows[0].len(), 1, "write {i} returns its row");
            assert_eq!(written.changes, vec![1, 1], "write {i}");
        }
        let rows: Vec<(i64, String)> = sqlx::query_as("SELECT k, v FROM t ORDER BY k")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(rows.len(), 40, "39 written and the one that was there");
        assert_eq!(rows[0], (7, "taken".to_owned()));
        assert!(rows[1..].iter().all(|(_, v)| v.ends_with('!')));
        assert!(
            combiner.shared.load(std::sync::atomic::Ordering::Relaxed) > 0,
            "some writes shared a transaction"
        );
    }
}
