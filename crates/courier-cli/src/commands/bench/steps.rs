//! `courier bench --runs --steps N`: the cost of a durable step. `--messages` runs (default
//! 100) of N steps each are executed one at a time by the runtime (claim, N steps, settle), each
//! step a [`RunContext::step`](courier_runs::RunContext::step) journaling a small result, guarded
//! by the run's claim (the write renews the lease too once a quarter of it has passed; a bench
//! run's steps come well before that), timed around the call. Beside it, run for run (ABBA: the side
//! that goes first alternates), a raw sqlx loop on the same database does the same durable work
//! for each step: in one transaction, the guarded lease renewal of its run row (indexed on
//! `(status, lease_expires)` for the reaper, as the run store's is) and the insert of the step's
//! row. Reports the per-step time (p50, p99), steps per second, the ratio (the median of the
//! per-round ratios over `--rounds`, default 5) and the SQL statements per step (counted by
//! [`super::counting`] for Courier).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::Dsn;
use courier_runs::{
    Agent, AgentError, AgentOutcome, Dialect, Effect, NewRun, Outcome, RunContext, RunStore,
    Runtime, SqlRunStore, SqlRunStoreOptions,
};
use courier_sql::PoolSettings;
use serde_json::json;

use super::counting::{CountingStore, STORE_METHODS};
use super::{chatty, print_json};
use crate::cli::{BenchArgs, Cli, Format};
use crate::error::{CliError, CliResult, chain};

/// Runs when `--messages` is not given.
const DEFAULT_RUNS: u64 = 100;

/// Times of each step, shared with the agent.
type Samples = Arc<Mutex<Vec<Duration>>>;

/// N durable steps of a trivial result, each timed.
struct Stepper {
    steps: u64,
    samples: Samples,
}

#[courier_runs::async_trait]
impl Agent for Stepper {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        for i in 0..self.steps {
            let started = Instant::now();
            let n: u64 = cx
                .step(&format!("step{i}"), Effect::Pure, |_| async move { Ok(i) })
                .await?;
            let took = started.elapsed();
            debug_assert_eq!(n, i);
            self.samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(took);
        }
        Ok(AgentOutcome::Completed(json!(self.steps)))
    }
}

fn failed(what: &str) -> impl FnOnce(sqlx::Error) -> CliError + '_ {
    move |e| CliError::runtime(format!("raw loop: {what}: {}", chain(&e)))
}

/// The raw side on one sqlx driver: its tables, one run row per run, and per step the
/// transaction (guarded renew + step insert), timed.
macro_rules! raw_side {
    ($name:ident, $db:ty) => {
        struct $name {
            pool: sqlx::Pool<$db>,
            runs: String,
            steps: String,
            renew: String,
            insert: String,
        }

        impl $name {
            async fn new(pool: sqlx::Pool<$db>, dialect: Dialect, prefix: &str) -> Result<Self, CliError> {
                let runs = format!("{prefix}_raw_runs");
                let steps = format!("{prefix}_raw_steps");
                for ddl in [
                    format!(
                        "CREATE TABLE {runs} (id VARCHAR(36) PRIMARY KEY, claimed_by VARCHAR(64) NOT NULL, \
                         status VARCHAR(16) NOT NULL, lease_expires BIGINT NOT NULL, updated_at BIGINT NOT NULL)"
                    ),
                    // The index the reaper's stale select needs, as the run store has it.
                    format!("CREATE INDEX {runs}_lease_idx ON {runs} (status, lease_expires)"),
                    format!(
                        "CREATE TABLE {steps} (run_id VARCHAR(36) NOT NULL, idx BIGINT NOT NULL, name VARCHAR(64) NOT NULL, \
                         output TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (run_id, idx))"
                    ),
                ] {
                    sqlx::query(&ddl).execute(&pool).await.map_err(failed("create its tables"))?;
                }
                Ok(Self {
                    renew: dialect.render(&format!(
                        "UPDATE {runs} SET lease_expires = {{now}} + ?, updated_at = {{now}} \
                         WHERE id = ? AND status = 'running' AND claimed_by = ?"
                    )),
                    insert: dialect.render(&format!(
                        "INSERT INTO {steps} (run_id, idx, name, output, created_at) VALUES (?, ?, ?, ?, {{now}})"
                    )),
                    pool,
                    runs,
                    steps,
                })
            }

            async fn run(&self, steps: u64, samples: &mut Vec<Duration>) -> Result<(), CliError> {
                let id = uuid::Uuid::new_v4().to_string();
                sqlx::query(&format!(
                    "INSERT INTO {} (id, claimed_by, status, lease_expires, updated_at) VALUES ('{id}', 'raw', 'running', 0, 0)",
                    self.runs
                ))
                .execute(&self.pool)
                .await
                .map_err(failed("insert a run"))?;
                for i in 0..steps {
                    let started = Instant::now();
                    let mut tx = self.pool.begin().await.map_err(failed("begin"))?;
                    let renewed = sqlx::query(&self.renew)
                        .bind(30_000_i64)
                        .bind(id.as_str())
                        .bind("raw")
                        .execute(&mut *tx)
                        .await
                        .map_err(failed("renew"))?;
                    if renewed.rows_affected() != 1 {
                        return Err(CliError::runtime("raw loop: the lease renewal matched no run"));
                    }
                    sqlx::query(&self.insert)
                        .bind(id.as_str())
                        .bind(i as i64)
                        .bind(format!("step{i}"))
                        .bind(i.to_string())
                        .execute(&mut *tx)
                        .await
                        .map_err(failed("insert a step"))?;
                    tx.commit().await.map_err(failed("commit"))?;
                    samples.push(started.elapsed());
                }
                Ok(())
            }

            async fn drop_tables(&self) {
                for t in [&self.steps, &self.runs] {
                    let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {t}")).execute(&self.pool).await;
                }
            }
        }
    };
}

#[cfg(feature = "sqlite")]
raw_side!(RawSqlite, sqlx::Sqlite);
#[cfg(feature = "postgres")]
raw_side!(RawPostgres, sqlx::Postgres);
#[cfg(feature = "mysql")]
raw_side!(RawMysql, sqlx::MySql);

/// The raw side of the dialect.
enum Raw {
    #[cfg(feature = "sqlite")]
    Sqlite(RawSqlite),
    #[cfg(feature = "postgres")]
    Postgres(RawPostgres),
    #[cfg(feature = "mysql")]
    Mysql(RawMysql),
}

impl Raw {
    async fn connect(dsn: &str, dialect: Dialect, prefix: &str) -> Result<Self, CliError> {
        let settings = PoolSettings {
            max_connections: Some(2),
            ..PoolSettings::default()
        };
        let connect =
            |e: sqlx::Error| CliError::runtime(format!("raw loop: cannot connect: {}", chain(&e)));
        Ok(match dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => Self::Sqlite(
                RawSqlite::new(
                    courier_sql::sqlite_pool(dsn, &settings)
                        .await
                        .map_err(connect)?,
                    dialect,
                    prefix,
                )
                .await?,
            ),
            #[cfg(feature = "postgres")]
            Dialect::Postgres => Self::Postgres(
                RawPostgres::new(
                    courier_sql::postgres_pool(dsn, &settings)
                        .await
                        .map_err(connect)?
                        .0,
                    dialect,
                    prefix,
                )
                .await?,
            ),
            #[cfg(feature = "mysql")]
            Dialect::Mysql => Self::Mysql(
                RawMysql::new(
                    courier_sql::mysql_pool(dsn, &settings)
                        .await
                        .map_err(connect)?
                        .0,
                    dialect,
                    prefix,
                )
                .await?,
            ),
            #[allow(unreachable_patterns, reason = "every dialect's feature may be on")]
            _ => {
                let _ = (dsn, prefix, settings, connect);
                return Err(CliError::usage(
                    "--runs --steps: this binary lacks the driver of --dsn",
                ));
            }
        })
    }

    async fn run(&self, steps: u64, samples: &mut Vec<Duration>) -> Result<(), CliError> {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(raw) => raw.run(steps, samples).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(raw) => raw.run(steps, samples).await,
            #[cfg(feature = "mysql")]
            Self::Mysql(raw) => raw.run(steps, samples).await,
        }
    }

    async fn drop_tables(&self) {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(raw) => raw.drop_tables().await,
            #[cfg(feature = "postgres")]
            Self::Postgres(raw) => raw.drop_tables().await,
            #[cfg(feature = "mysql")]
            Self::Mysql(raw) => raw.drop_tables().await,
        }
    }
}

/// (p50, p99) in microseconds, and steps per second over the samples' total.
fn summary(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let total: Duration = samples.iter().sum();
    let per_s = samples.len() as f64 / total.as_secs_f64().max(1e-9);
    (at(0.5), at(0.99), per_s)
}

pub(super) async fn measure(cli: &Cli, args: &BenchArgs, dsn: &Dsn, steps: u64) -> CliResult {
    let store_dsn = crate::runs::store_dsn(Some(dsn.expose_without_query()));
    let dialect = Dialect::from_dsn(&store_dsn).map_err(|_| {
        CliError::usage(format!(
            "--runs --steps: the run store needs a SQL --dsn (sqlite://, postgres://, mysql://), not `{}`",
            dsn.scheme()
        ))
    })?;
    let prefix = format!("bench_{}", fastrand::u32(..));
    let options = SqlRunStoreOptions::default()
        .table_prefix(&prefix)
        .max_connections(2);
    let store = SqlRunStore::connect(&store_dsn, options)
        .await
        .map_err(|e| CliError::runtime(format!("cannot open the run store: {}", chain(&e))))?;
    store
        .setup()
        .await
        .map_err(|e| CliError::runtime(format!("cannot set up the run store: {}", chain(&e))))?;
    let store = Arc::new(store);
    let raw = match Raw::connect(&store_dsn, dialect, &prefix).await {
        Ok(raw) => raw,
        Err(e) => {
            let _ = store.drop_tables().await;
            return Err(e);
        }
    };
    let result = execute(cli, args, dsn, steps, store.clone(), dialect, &raw).await;
    raw.drop_tables().await;
    let _ = store.drop_tables().await;
    result
}

async fn execute(
    cli: &Cli,
    args: &BenchArgs,
    dsn: &Dsn,
    steps: u64,
    store: Arc<SqlRunStore>,
    dialect: Dialect,
    raw: &Raw,
) -> CliResult {
    let runs = args.messages.unwrap_or(DEFAULT_RUNS);
    let counting = Arc::new(CountingStore::new(store, dialect));
    let samples: Samples = Arc::default();
    let runtime = Runtime::builder(counting.clone() as Arc<dyn RunStore>)
        .agent(
            "stepper",
            Stepper {
                steps,
                samples: samples.clone(),
            },
        )
        .build();
    if chatty(cli) {
        eprintln!(
            "Steps on {dsn}: {runs} runs of {steps} durable steps, one run at a time, beside a raw sqlx loop"
        );
    }
    let mut raw_samples = Vec::with_capacity((runs * steps) as usize);
    let mut journal_calls = 0;
    let journal = STORE_METHODS
        .iter()
        .position(|m| *m == "journal")
        .unwrap_or_default();
    let rounds = u64::from(args.rounds.unwrap_or(5).max(1)).min(runs.max(1));
    // Where each round's samples end, on each side.
    let mut ends = Vec::with_capacity(rounds as usize);
    for i in 0..runs {
        let run = counting
            .insert_queued(&NewRun::new("stepper", json!({})))
            .await
            .map_err(|e| CliError::runtime(format!("cannot submit a run: {}", chain(&e))))?;
        // ABBA: the side that goes first alternates, so neither always follows the other's writes.
        if i % 2 == 1 {
            raw.run(steps, &mut raw_samples).await?;
        }
        let before = counting.calls();
        let outcome = runtime
            .run_queued(run.id)
            .await
            .map_err(|e| CliError::runtime(format!("a run failed: {}", chain(&e))))?;
        if !matches!(outcome, Outcome::Completed { .. }) {
            return Err(CliError::runtime(format!("a run ended {outcome:?}")));
        }
        let after = counting.calls();
        journal_calls += after[journal] - before[journal];
        if i % 2 == 0 {
            raw.run(steps, &mut raw_samples).await?;
        }
        if (i + 1) * rounds / runs != i * rounds / runs {
            let ours = samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .len();
            ends.push((ours, raw_samples.len()));
        }
    }
    let mut ours = std::mem::take(
        &mut *samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let total_steps = ours.len() as u64;
    let mut journal_only = [0; STORE_METHODS.len()];
    journal_only[journal] = journal_calls;
    let statements = counting.statements(&journal_only) as f64 / total_steps.max(1) as f64;
    let round_trips = counting.round_trips(&journal_only) as f64 / total_steps.max(1) as f64;
    // BEGIN, the renew, the insert, COMMIT: each a round trip of its own.
    let raw_statements = 4.0;
    let mut round_ratios: Vec<f64> = Vec::with_capacity(ends.len());
    let mut start = (0, 0);
    for &(o, r) in &ends {
        let (_, _, ours_per_s) = summary(&mut ours[start.0..o].to_vec());
        let (_, _, raw_per_s) = summary(&mut raw_samples[start.1..r].to_vec());
        round_ratios.push(ours_per_s / raw_per_s.max(1e-9));
        start = (o, r);
    }
    let mut sorted = round_ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let median_ratio = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let (p50, p99, per_s) = summary(&mut ours);
    let (raw_p50, raw_p99, raw_per_s) = summary(&mut raw_samples);
    let ratio = per_s / raw_per_s.max(1e-9);
    if cli.format == Format::Json {
        return print_json(&json!({
            "mode": "steps",
            "dsn": dsn.to_string(),
            "runs": runs,
            "steps_per_run": steps,
            "courier": {"p50_us": p50, "p99_us": p99, "steps_per_s": per_s},
            "raw": {"p50_us": raw_p50, "p99_us": raw_p99, "steps_per_s": raw_per_s},
            "ratio": median_ratio,
            "overall_ratio": ratio,
            "round_ratios": round_ratios,
            "statements_per_step": {"courier": statements, "raw": raw_statements},
            "round_trips_per_step": {"courier": round_trips, "raw": raw_statements},
        }));
    }
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "", "p50 us", "p99 us", "steps/s", "stmts/step", "trips/step"
    );
    println!(
        "{:<8} {p50:>9.0} {p99:>9.0} {per_s:>9.0} {statements:>11.2} {round_trips:>11.2}",
        "courier"
    );
    println!(
        "{:<8} {raw_p50:>9.0} {raw_p99:>9.0} {raw_per_s:>9.0} {raw_statements:>11.2} {raw_statements:>11.2}",
        "raw"
    );
    let listed: Vec<String> = round_ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "ratio (courier / raw steps/s): median of {} rounds {median_ratio:.2} (rounds {}), overall {ratio:.2}",
        round_ratios.len(),
        listed.join(", ")
    );
    Ok(())
}
