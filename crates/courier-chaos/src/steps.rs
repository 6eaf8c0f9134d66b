//! The durable steps crash tests (issue 38): the agent the `steps-worker` binary runs, whose
//! every step has a side effect in the database (a counter per run and step, with the
//! idempotency key the step was given), and the settings the binary reads from its environment.
//!
//! A run's input is a [`StepsPlan`]: how many steps, each step's [`StepKind`] (which decides
//! its [`Effect`]), how long each sleeps after its effect, and the completion tokens each
//! reports. Step `i` is named `s<i>` and, in order: adds one to the row `(run, i)` of the
//! effects table [`Effects`] (`<prefix>_effects`), stalls forever if the worker was told to
//! stall there ([`STALL_DIR_ENV`], writing a marker file first), sleeps its milliseconds,
//! reports its tokens and returns `i * i`. The effect comes first, so a worker killed in the
//! sleep leaves an effect done and no journaled result: the ambiguous case.
//!
//! The effects table is written outside the step journal's transaction, as a real effect
//! would be; a test reads it back ([`Effects::rows`]) to count how often each step ran.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use courier_runs::{
    Agent, AgentError, AgentOutcome, Effect, OnAmbiguous, ProviderError, RunContext, Usage,
    async_trait,
};
use serde_json::{Value, json};
use sqlx::AnyPool;
use uuid::Uuid;

/// The agent's name in the runtime.
pub const STEPS_AGENT: &str = "steps";

/// The run store's DSN (`sqlite://`, `postgres://`, `mysql://`); the effects table is there too.
pub const STORE_ENV: &str = "STEPS_STORE";
/// The prefix of every table: the run store's (`<prefix>_runs`...) and `<prefix>_effects`.
pub const PREFIX_ENV: &str = "STEPS_PREFIX";
/// The DSN of the SQL transport `RunAgent` travels on.
pub const QUEUE_ENV: &str = "STEPS_QUEUE";
/// The runs' lease, in milliseconds (default 3000).
pub const LEASE_ENV: &str = "STEPS_LEASE_MS";
/// How often the worker's reaper runs, in milliseconds (default 500).
pub const REAP_ENV: &str = "STEPS_REAP_MS";
/// Runs handled at once by the worker (default 1).
pub const CONCURRENCY_ENV: &str = "STEPS_CONCURRENCY";
/// `max_requeues` of the runtime (default 3, the runtime's own default).
pub const MAX_REQUEUES_ENV: &str = "STEPS_MAX_REQUEUES";
/// A directory: the first time this process runs step [`STALL_STEP_ENV`] of a run, after the
/// step's effect, it writes the file `<dir>/<run id>` and sleeps for an hour (to be killed).
pub const STALL_DIR_ENV: &str = "STEPS_STALL_DIR";
/// The step to stall in (default 6).
pub const STALL_STEP_ENV: &str = "STEPS_STALL_STEP";

/// What a step is, in a plan: its [`Effect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// [`Effect::Pure`].
    Pure,
    /// [`Effect::Idempotent`].
    Idempotent,
    /// [`Effect::Guarded`] with [`OnAmbiguous::Retry`].
    Retry,
    /// [`Effect::Guarded`] with [`OnAmbiguous::Park`].
    Park,
    /// [`Effect::Guarded`] with [`OnAmbiguous::Fail`].
    Fail,
}

impl StepKind {
    /// Every kind.
    pub const ALL: [Self; 5] = [
        Self::Pure,
        Self::Idempotent,
        Self::Retry,
        Self::Park,
        Self::Fail,
    ];

    /// The name in a plan: `pure`, `idempotent`, `retry`, `park`, `fail`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pure => "pure",
            Self::Idempotent => "idempotent",
            Self::Retry => "retry",
            Self::Park => "park",
            Self::Fail => "fail",
        }
    }

    /// The kind named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The step's effect.
    #[must_use]
    pub fn effect(self) -> Effect {
        match self {
            Self::Pure => Effect::Pure,
            Self::Idempotent => Effect::Idempotent,
            Self::Retry => Effect::Guarded(OnAmbiguous::Retry),
            Self::Park => Effect::Guarded(OnAmbiguous::Park),
            Self::Fail => Effect::Guarded(OnAmbiguous::Fail),
        }
    }

    /// Whether running it again after a crash is allowed (pure, idempotent, guarded with retry).
    #[must_use]
    pub fn may_rerun(self) -> bool {
        matches!(self, Self::Pure | Self::Idempotent | Self::Retry)
    }
}

/// A run's input: its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepsPlan {
    /// Each step's kind, step 1 first.
    pub kinds: Vec<StepKind>,
    /// How long each step sleeps after its effect, in milliseconds.
    pub ms: Vec<u64>,
    /// Completion tokens each step reports.
    pub tokens_out: u64,
}

impl StepsPlan {
    /// The plan as a run's input.
    #[must_use]
    pub fn to_input(&self) -> Value {
        json!({
            "kinds": self.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            "ms": self.ms,
            "tokens_out": self.tokens_out,
        })
    }

    /// Reads a run's input.
    ///
    /// # Errors
    /// A missing or unknown kind, `ms` of another length than `kinds`.
    pub fn from_input(input: &Value) -> Result<Self, String> {
        let kinds = input["kinds"]
            .as_array()
            .ok_or("the input has no `kinds` array")?
            .iter()
            .map(|k| {
                k.as_str()
                    .and_then(StepKind::parse)
                    .ok_or_else(|| format!("unknown step kind {k}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ms = input["ms"]
            .as_array()
            .ok_or("the input has no `ms` array")?
            .iter()
            .map(|m| m.as_u64().ok_or_else(|| format!("`ms` holds {m}")))
            .collect::<Result<Vec<_>, _>>()?;
        if ms.len() != kinds.len() {
            return Err(format!("{} kinds but {} durations", kinds.len(), ms.len()));
        }
        Ok(Self {
            kinds,
            ms,
            tokens_out: input["tokens_out"].as_u64().unwrap_or(0),
        })
    }

    /// The output of a run that completed the plan: `{"outputs": [1, 4, 9, ...]}`.
    #[must_use]
    pub fn expected_output(&self) -> Value {
        let outputs: Vec<i64> = (1..=i64::try_from(self.kinds.len()).unwrap_or(0))
            .map(|i| i * i)
            .collect();
        json!({ "outputs": outputs })
    }
}

/// The database dialects of the effects table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Db {
    Sqlite,
    Postgres,
    Mysql,
}

/// The effects table `<prefix>_effects(run_id, step, idem_key, n)`: one row per run and step,
/// `n` the number of times the step's closure did its effect, `idem_key` the idempotency key
/// it was given (`mismatch` once two attempts were given different keys).
#[derive(Debug, Clone)]
pub struct Effects {
    pool: AnyPool,
    db: Db,
    table: String,
}

/// One row of the effects table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRow {
    /// The run.
    pub run_id: Uuid,
    /// The step's index, from 1.
    pub step: i64,
    /// The idempotency key given (`mismatch` if the attempts were given different ones).
    pub key: String,
    /// How many times the step did its effect.
    pub n: i64,
}

/// Whether `name` is a table name this module may splice into SQL: a lowercase ASCII letter,
/// then lowercase letters, digits and `_`, at most 48 characters.
#[must_use]
pub fn is_valid_prefix(name: &str) -> bool {
    name.len() <= 48
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Effects {
    /// Connects to the effects table of `prefix` in the database of `dsn` (not created).
    ///
    /// # Errors
    /// An invalid prefix, an unsupported DSN, a connection failure.
    pub async fn connect(dsn: &str, prefix: &str) -> anyhow::Result<Self> {
        if !is_valid_prefix(prefix) {
            bail!("invalid table prefix `{prefix}`: a lowercase letter, then a-z, 0-9 and _");
        }
        let db = if dsn.starts_with("sqlite:") {
            Db::Sqlite
        } else if dsn.starts_with("postgres:") || dsn.starts_with("postgresql:") {
            Db::Postgres
        } else if dsn.starts_with("mysql:") || dsn.starts_with("mariadb:") {
            Db::Mysql
        } else {
            bail!(
                "unsupported effects DSN `{}` (sqlite, postgres, mysql)",
                courier_core::redact(dsn)
            );
        };
        sqlx::any::install_default_drivers();
        let pool = sqlx::pool::PoolOptions::<sqlx::Any>::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(dsn)
            .await
            .with_context(|| format!("connecting to {}", courier_core::redact(dsn)))?;
        Ok(Self {
            pool,
            db,
            table: format!("{prefix}_effects"),
        })
    }

    /// The table's name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it does not exist.
    ///
    /// # Errors
    /// The database failed.
    pub async fn create(&self) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {} (run_id VARCHAR(36) NOT NULL, step BIGINT NOT NULL, \
             idem_key VARCHAR(100) NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (run_id, step))",
            self.table
        ))
        .execute(&self.pool)
        .await
        .with_context(|| format!("creating {}", self.table))?;
        Ok(())
    }

    /// Drops the table.
    ///
    /// # Errors
    /// The database failed.
    pub async fn drop_table(&self) -> anyhow::Result<()> {
        sqlx::query(&format!("DROP TABLE IF EXISTS {}", self.table))
            .execute(&self.pool)
            .await
            .with_context(|| format!("dropping {}", self.table))?;
        Ok(())
    }

    /// Step `step` of `run_id` did its effect once more, given `key`.
    ///
    /// # Errors
    /// The database failed.
    pub async fn record(&self, run_id: Uuid, step: i64, key: &str) -> Result<(), sqlx::Error> {
        let t = &self.table;
        let sql = match self.db {
            Db::Sqlite => format!(
                "INSERT INTO {t} (run_id, step, idem_key, n) VALUES (?, ?, ?, 1) \
                 ON CONFLICT (run_id, step) DO UPDATE SET n = {t}.n + 1, idem_key = CASE \
                 WHEN {t}.idem_key = excluded.idem_key THEN {t}.idem_key ELSE 'mismatch' END"
            ),
            Db::Postgres => format!(
                "INSERT INTO {t} (run_id, step, idem_key, n) VALUES ($1, $2, $3, 1) \
                 ON CONFLICT (run_id, step) DO UPDATE SET n = {t}.n + 1, idem_key = CASE \
                 WHEN {t}.idem_key = excluded.idem_key THEN {t}.idem_key ELSE 'mismatch' END"
            ),
            Db::Mysql => format!(
                "INSERT INTO {t} (run_id, step, idem_key, n) VALUES (?, ?, ?, 1) \
                 ON DUPLICATE KEY UPDATE idem_key = IF(idem_key = VALUES(idem_key), idem_key, \
                 'mismatch'), n = n + 1"
            ),
        };
        sqlx::query(&sql)
            .bind(run_id.to_string())
            .bind(step)
            .bind(key.to_owned())
            .execute(&self.pool)
            .await
            .map(drop)
    }

    /// Every row.
    ///
    /// # Errors
    /// The database failed, a row's run id is not a UUID.
    pub async fn rows(&self) -> anyhow::Result<Vec<EffectRow>> {
        let rows: Vec<(String, i64, String, i64)> = sqlx::query_as(&format!(
            "SELECT run_id, step, idem_key, n FROM {} ORDER BY run_id, step",
            self.table
        ))
        .fetch_all(&self.pool)
        .await
        .with_context(|| format!("reading {}", self.table))?;
        rows.into_iter()
            .map(|(run_id, step, key, n)| {
                Ok(EffectRow {
                    run_id: run_id
                        .parse()
                        .with_context(|| format!("run id `{run_id}` in {}", self.table))?,
                    step,
                    key,
                    n,
                })
            })
            .collect()
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Where a worker stalls: after the effect of step `step`, once per run.
#[derive(Debug, Clone)]
pub struct Stall {
    /// The directory of the marker files (`<dir>/<run id>`).
    pub dir: PathBuf,
    /// The step.
    pub step: i64,
}

/// The agent: runs a [`StepsPlan`] as durable steps, each recording its effect in [`Effects`].
#[derive(Debug, Clone)]
pub struct StepsAgent {
    effects: Effects,
    stall: Option<Stall>,
}

impl StepsAgent {
    /// An agent recording into `effects`, stalling where `stall` says.
    #[must_use]
    pub fn new(effects: Effects, stall: Option<Stall>) -> Self {
        Self { effects, stall }
    }
}

#[async_trait]
impl Agent for StepsAgent {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let plan = StepsPlan::from_input(cx.input())
            .map_err(|e| AgentError::from(ProviderError::Configuration(e)))?;
        let run_id = cx.run().id;
        let mut outputs = Vec::with_capacity(plan.kinds.len());
        for (i, (kind, ms)) in (1_i64..).zip(plan.kinds.iter().zip(&plan.ms)) {
            let effects = self.effects.clone();
            let stall = self
                .stall
                .as_ref()
                .filter(|s| s.step == i)
                .map(|s| s.dir.join(run_id.to_string()));
            let (ms, tokens) = (*ms, plan.tokens_out);
            let output: i64 = cx
                .step(&format!("s{i}"), kind.effect(), |scope| async move {
                    effects
                        .record(run_id, i, scope.key())
                        .await
                        .map_err(|e| ProviderError::Connection(Some(Box::new(e))))?;
                    if let Some(marker) = stall.filter(|m| !m.exists()) {
                        std::fs::write(&marker, scope.key()).map_err(AgentError::other)?;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    scope.report(Usage::tokens(0, tokens));
                    Ok(i * i)
                })
                .await?;
            outputs.push(output);
        }
        Ok(AgentOutcome::Completed(json!({ "outputs": outputs })))
    }
}

/// What `steps-worker` reads from its environment.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// [`STORE_ENV`].
    pub store: String,
    /// [`PREFIX_ENV`].
    pub prefix: String,
    /// [`QUEUE_ENV`].
    pub queue: String,
    /// [`LEASE_ENV`].
    pub lease: Duration,
    /// [`REAP_ENV`].
    pub reap_every: Duration,
    /// [`CONCURRENCY_ENV`].
    pub concurrency: usize,
    /// [`MAX_REQUEUES_ENV`].
    pub max_requeues: u32,
    /// [`STALL_DIR_ENV`] and [`STALL_STEP_ENV`].
    pub stall: Option<Stall>,
}

fn var(name: &str) -> anyhow::Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Ok(Some(v)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => bail!("{name}: {e}"),
    }
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match var(name)? {
        Some(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name} must be a number, not `{v}`")),
        None => Ok(default),
    }
}

impl WorkerSettings {
    /// Reads the settings.
    ///
    /// # Errors
    /// A required variable is missing, a number is not one, the prefix is invalid.
    pub fn from_env() -> anyhow::Result<Self> {
        let required =
            |name: &str| var(name)?.with_context(|| format!("{name} is not set (see `steps`)"));
        let prefix = required(PREFIX_ENV)?;
        if !is_valid_prefix(&prefix) {
            bail!("{PREFIX_ENV}: invalid table prefix `{prefix}`");
        }
        let stall = match var(STALL_DIR_ENV)? {
            Some(dir) => Some(Stall {
                dir: dir.into(),
                step: number(STALL_STEP_ENV, 6)?,
            }),
            None => None,
        };
        Ok(Self {
            store: required(STORE_ENV)?,
            prefix,
            queue: required(QUEUE_ENV)?,
            lease: Duration::from_millis(number(LEASE_ENV, 3000)?),
            reap_every: Duration::from_millis(number(REAP_ENV, 500)?),
            concurrency: number(CONCURRENCY_ENV, 1)?,
            max_requeues: number(MAX_REQUEUES_ENV, 3)?,
            stall,
        })
    }
}
