//! Durable steps: what a step is ([`Effect`], [`OnAmbiguous`]), what it reports ([`Usage`]),
//! what bounds a run ([`Budget`]), what the journal holds ([`StepRecord`]) and what a durable
//! wait returns ([`Signal`]). The step boundary itself is [`RunContext::step`](crate::RunContext::step).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What running a step's closure twice would do, which decides what happens when a worker died
/// between doing it and journaling its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Effect {
    /// No effect outside the run (a computation, a read): run again after a crash.
    Pure,
    /// An effect that is safe to repeat (an upsert, a PUT, a call deduplicated by the
    /// [`StepScope::key`] the closure passes on): run again after a crash.
    Idempotent,
    /// An effect that must not silently happen twice (a payment, an email): its intent is
    /// journaled before the closure runs, and a resume that finds the intent without a result
    /// does what the policy says.
    Guarded(OnAmbiguous),
}

impl Effect {
    /// The stored name: `pure`, `idempotent`, `guarded`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pure => "pure",
            Self::Idempotent => "idempotent",
            Self::Guarded(_) => "guarded",
        }
    }
}

/// What a resumed run does with a guarded step that began (its intent is journaled) and never
/// recorded a result: nobody knows whether its effect happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnAmbiguous {
    /// Run the closure again with the same [`StepScope::key`], for the outside system to
    /// deduplicate.
    Retry,
    /// Stop the run `waiting_for_approval`, naming the step, until an operator retries it,
    /// skips it with a result of their own, or fails the run
    /// ([`Runtime::resolve_step`](crate::Runtime::resolve_step)).
    Park,
    /// Fail the run (class `ambiguous_effect`, never retried), naming the step.
    Fail,
}

/// What a step consumed, reported by its closure with [`StepScope::report`]; added to the run's
/// totals in the same write that journals the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Usage {
    /// Prompt tokens.
    pub tokens_in: u64,
    /// Completion tokens.
    pub tokens_out: u64,
    /// Cost in micro-units of the currency the budget is set in.
    pub cost_micros: u64,
    /// Tool calls made.
    pub tool_calls: u64,
    /// Model turns taken.
    pub turns: u64,
}

impl Usage {
    /// Usage of `tokens_in` prompt and `tokens_out` completion tokens in one turn.
    #[must_use]
    pub fn tokens(tokens_in: u64, tokens_out: u64) -> Self {
        Self {
            tokens_in,
            tokens_out,
            turns: 1,
            ..Self::default()
        }
    }

    /// One tool call.
    #[must_use]
    pub fn tool_call() -> Self {
        Self {
            tool_calls: 1,
            ..Self::default()
        }
    }

    /// This usage with `cost_micros` added.
    #[must_use]
    pub fn with_cost(mut self, cost_micros: u64) -> Self {
        self.cost_micros = self.cost_micros.saturating_add(cost_micros);
        self
    }

    /// The sum of both, saturating.
    #[must_use]
    pub fn plus(self, other: Usage) -> Self {
        Self {
            tokens_in: self.tokens_in.saturating_add(other.tokens_in),
            tokens_out: self.tokens_out.saturating_add(other.tokens_out),
            cost_micros: self.cost_micros.saturating_add(other.cost_micros),
            tool_calls: self.tool_calls.saturating_add(other.tool_calls),
            turns: self.turns.saturating_add(other.turns),
        }
    }

    /// Whether nothing was used.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// The limits of a run, stored with it: checked before each step against the usage its steps
/// journaled, so that no crash, requeue or resume elsewhere resets them. A limit reached ends
/// the run `failed` / `budget_exhausted`, never retried. `None` is no limit.
///
/// ```
/// use courier_runs::Budget;
/// use std::time::Duration;
/// let budget = Budget::new().tokens_out(1_000).tool_calls(20).wall_time(Duration::from_secs(600));
/// assert_eq!(budget.tokens_out, Some(1_000));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Budget {
    /// Prompt tokens.
    pub tokens_in: Option<u64>,
    /// Completion tokens.
    pub tokens_out: Option<u64>,
    /// Cost, micro-units.
    pub cost_micros: Option<u64>,
    /// Tool calls.
    pub tool_calls: Option<u64>,
    /// Model turns.
    pub turns: Option<u64>,
    /// Milliseconds from the run's first start.
    pub wall_time_ms: Option<u64>,
}

impl Budget {
    /// No limits.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Limits prompt tokens.
    #[must_use]
    pub fn tokens_in(mut self, n: u64) -> Self {
        self.tokens_in = Some(n);
        self
    }

    /// Limits completion tokens.
    #[must_use]
    pub fn tokens_out(mut self, n: u64) -> Self {
        self.tokens_out = Some(n);
        self
    }

    /// Limits cost, in micro-units.
    #[must_use]
    pub fn cost_micros(mut self, n: u64) -> Self {
        self.cost_micros = Some(n);
        self
    }

    /// Limits tool calls.
    #[must_use]
    pub fn tool_calls(mut self, n: u64) -> Self {
        self.tool_calls = Some(n);
        self
    }

    /// Limits model turns.
    #[must_use]
    pub fn turns(mut self, n: u64) -> Self {
        self.turns = Some(n);
        self
    }

    /// Limits the time from the run's first start.
    #[must_use]
    pub fn wall_time(mut self, limit: Duration) -> Self {
        self.wall_time_ms = Some(u64::try_from(limit.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The first limit `used` (after `elapsed_ms` of wall time) has reached, as
    /// `(name, used, limit)`; `None` while every limit leaves room.
    #[must_use]
    pub fn exhausted(&self, used: &Usage, elapsed_ms: u64) -> Option<(&'static str, u64, u64)> {
        [
            ("tokens_in", used.tokens_in, self.tokens_in),
            ("tokens_out", used.tokens_out, self.tokens_out),
            ("cost_micros", used.cost_micros, self.cost_micros),
            ("tool_calls", used.tool_calls, self.tool_calls),
            ("turns", used.turns, self.turns),
            ("wall_time_ms", elapsed_ms, self.wall_time_ms),
        ]
        .into_iter()
        .find_map(|(name, used, limit)| limit.filter(|l| used >= *l).map(|l| (name, used, l)))
    }

    /// Whether no limit is set.
    #[must_use]
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }
}

/// What a step's closure gets: its idempotency key, and where it reports its usage.
#[derive(Debug, Clone)]
pub struct StepScope {
    pub(crate) key: String,
    pub(crate) index: i64,
    pub(crate) usage: Arc<Mutex<Usage>>,
}

impl StepScope {
    /// The step's idempotency key, `<run id>:<step index>`: the same on every attempt and every
    /// host, to pass to the outside system (an `Idempotency-Key` header, a unique column).
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The step's index in its run, from 1.
    #[must_use]
    pub fn index(&self) -> i64 {
        self.index
    }

    /// Adds `usage` to what this step reports with its result.
    pub fn report(&self, usage: Usage) {
        let mut total = self
            .usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *total = total.plus(usage);
    }

    pub(crate) fn reported(&self) -> Usage {
        *self
            .usage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where a journaled step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StepStatus {
    /// A guarded step began; no result yet.
    Intent,
    /// An operator asked for a parked step to run again (with the same key).
    Retry,
    /// A durable wait is pending.
    Waiting,
    /// Finished with a result.
    Done,
    /// Finished with a terminal error.
    Failed,
}

impl StepStatus {
    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intent => "intent",
            Self::Retry => "retry",
            Self::Waiting => "waiting",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    /// Parses a stored name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Intent,
            Self::Retry,
            Self::Waiting,
            Self::Done,
            Self::Failed,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// One row of a run's step journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    /// The run.
    pub run_id: Uuid,
    /// The step's position in its run, from 1.
    pub index: i64,
    /// The step's name.
    pub name: String,
    /// `pure`, `idempotent`, `guarded`, or `wait` for a durable wait.
    pub effect: String,
    /// Where it stands.
    pub status: StepStatus,
    /// Its result (JSON), once done; a wait's due time or signal while waiting.
    pub output: Option<serde_json::Value>,
    /// Its terminal error, if it failed.
    pub error: Option<String>,
    /// The class of that error.
    pub error_class: Option<String>,
    /// What it used.
    pub usage: Usage,
    /// How long its closure ran, ms (the last attempt).
    pub duration_ms: i64,
    /// How many journaled ends it had: 1 once done (0 while an intent or a wait is pending; more
    /// when an operator retried a finished step's intent).
    pub attempts: i64,
    /// When it was first journaled, epoch ms.
    pub created_at: i64,
    /// When it finished, epoch ms.
    pub finished_at: Option<i64>,
}

/// How a journal write touches the step's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalMode {
    /// A new row.
    Insert,
    /// The row holds an intent, a retry or a wait: update it.
    Finish,
}

/// One write to the step journal, made in the guarded statement that renews the run's lease.
#[derive(Debug, Clone)]
pub struct StepWrite {
    /// Insert a row, or finish the row already there.
    pub mode: JournalMode,
    /// The step's index, from 1.
    pub index: i64,
    /// Its name.
    pub name: String,
    /// Its effect (`Effect::as_str`, or `wait`).
    pub effect: &'static str,
    /// What it is now.
    pub status: StepStatus,
    /// Its result or wait state.
    pub output: Option<serde_json::Value>,
    /// Its terminal error.
    pub error: Option<String>,
    /// The class of that error.
    pub error_class: Option<String>,
    /// What it used: added to the run's totals in the same write.
    pub usage: Usage,
    /// How long its closure ran, ms.
    pub duration_ms: i64,
    /// Steps replayed since the last write: added to the run's replay count.
    pub replayed: u64,
}

/// What a durable wait for a signal returned.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Signal {
    /// The signal arrived.
    Received {
        /// Its data.
        data: serde_json::Value,
        /// Who sent it (as the sender said).
        by: Option<String>,
        /// When it was recorded, epoch ms.
        at: i64,
    },
    /// The timeout passed first.
    Timeout,
}

/// How an operator resolves a guarded step a run parked on
/// ([`Runtime::resolve_step`](crate::Runtime::resolve_step)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Resolution {
    /// Run the step again, with the same key.
    Retry,
    /// Do not run it: journal this result for it, as if it had returned it.
    Skip(serde_json::Value),
    /// Fail the run (class `ambiguous_effect`).
    Fail,
}

/// The name of a signal event in a run's events.
pub(crate) const SIGNAL_EVENT: &str = "signal";
/// The effect name of a durable wait's journal row.
pub(crate) const WAIT_EFFECT: &str = "wait";
/// The due time of a wait without a timeout: never (epoch ms far past any clock).
pub(crate) const FOREVER: i64 = i64::MAX / 4;
