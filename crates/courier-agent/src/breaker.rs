//! Circuit breakers, one per provider, shared by every worker through a [`BreakerStore`]: in
//! memory ([`MemoryBreakers`], one process) or in the run store's database ([`SqlBreakers`],
//! every process on that database).
//!
//! A breaker is `closed` until [`BreakerPolicy::failures`] failures fall within one
//! [`BreakerPolicy::window`]; then `open`: calls to the provider are refused (the chain moves
//! on) for [`BreakerPolicy::cooldown`]. After it, the first worker to ask turns it `half_open`
//! and probes; the others are still refused. The probe's success closes it, its failure opens
//! it again. A prober that died is replaced once [`BreakerPolicy::probe_timeout`] has passed.
//! Every transition is one guarded statement, so two workers never both probe.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

mod sql;

pub use sql::{DEFAULT_BREAKER_TABLE, LazySqlBreakers, SqlBreakers};

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Failures within the window that open it.
    pub failures: u32,
    /// The window failures are counted in.
    pub window: Duration,
    /// How long it stays open before one worker probes.
    pub cooldown: Duration,
    /// How long a probe may take before another worker probes instead.
    pub probe_timeout: Duration,
}

impl Default for BreakerPolicy {
    /// 5 failures in 60 s open it for 30 s; a probe gets 120 s.
    fn default() -> Self {
        Self {
            failures: 5,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(120),
        }
    }
}

/// What a breaker says to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Closed: call.
    Closed,
    /// Half-open and this caller probes: call, and report the result.
    Probe,
    /// Open (or half-open with another worker probing): do not call.
    Open,
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Calls go through.
    Closed,
    /// Calls are refused.
    Open,
    /// One worker probes.
    HalfOpen,
}

impl State {
    /// `closed`, `open`, `half_open`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "open" => Self::Open,
            "half_open" => Self::HalfOpen,
            _ => Self::Closed,
        }
    }
}

impl State {
    /// Its value in the [`STATE_GAUGE`]: 0 closed, 1 half-open, 2 open.
    #[must_use]
    pub fn gauge_value(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::HalfOpen => 1.0,
            Self::Open => 2.0,
        }
    }
}

/// The gauge of each provider's breaker state, label `provider`: 0 closed, 1 half-open, 2 open
/// ([`State::gauge_value`]).
pub const STATE_GAUGE: &str = "courier_agent_breaker_state";
/// The gauge of each provider's failures in its breaker's current window, label `provider`.
pub const FAILURES_GAUGE: &str = "courier_agent_breaker_failures";

/// Reads every breaker of `store` and sets [`STATE_GAUGE`] and [`FAILURES_GAUGE`] for each
/// provider through the `metrics` facade (nothing is recorded without a recorder); returns the
/// rows.
///
/// # Errors
/// The store failed.
pub async fn record_gauges(store: &dyn BreakerStore) -> Result<Vec<BreakerRow>, BreakerError> {
    let rows = store.rows().await?;
    for row in &rows {
        metrics::gauge!(STATE_GAUGE, "provider" => row.provider.clone())
            .set(row.state.gauge_value());
        metrics::gauge!(FAILURES_GAUGE, "provider" => row.provider.clone())
            .set(f64::from(row.failures));
    }
    Ok(rows)
}

/// Calls [`record_gauges`] every `every` until `stop` is cancelled (a failed read is logged and
/// retried at the next tick). `courier consume --metrics` runs it when an agent has breakers.
pub fn spawn_gauges(
    store: Arc<dyn BreakerStore>,
    every: Duration,
    stop: courier_core::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = record_gauges(store.as_ref()).await {
                tracing::warn!(error = %e, "reading the circuit breakers for their gauges failed");
            }
        }
    })
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One provider's breaker as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerRow {
    /// The provider.
    pub provider: String,
    /// Its state.
    pub state: State,
    /// Failures in the current window.
    pub failures: u32,
    /// When the window began, epoch ms.
    pub window_start: i64,
    /// When it last opened, epoch ms.
    pub opened_at: i64,
    /// Until when the current probe holds the half-open breaker, epoch ms.
    pub probe_until: i64,
}

impl BreakerRow {
    fn new(provider: &str, now: i64) -> Self {
        Self {
            provider: provider.to_owned(),
            state: State::Closed,
            failures: 0,
            window_start: now,
            opened_at: 0,
            probe_until: 0,
        }
    }
}

/// A breaker store failed (the call then goes on as if the breaker were closed: a breaker
/// never stops a run by itself).
#[derive(Debug, thiserror::Error)]
#[error("circuit breaker store failed while {doing}")]
pub struct BreakerError {
    doing: &'static str,
    #[source]
    source: courier_core::BoxError,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Where breakers live. `now` is epoch ms (the caller's clock; tests pass their own).
#[async_trait]
pub trait BreakerStore: Send + Sync + fmt::Debug + 'static {
    /// Whether a call to `provider` may go.
    async fn acquire(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<Permit, BreakerError>;
    /// A call failed in a way that counts (connection, server error, rate limit, protocol).
    async fn failure(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<(), BreakerError>;
    /// A call the permit let through succeeded (the provider answered): a probe closes it.
    async fn success(&self, provider: &str, permit: Permit, now: i64) -> Result<(), BreakerError>;
    /// Every breaker, by provider name.
    async fn rows(&self) -> Result<Vec<BreakerRow>, BreakerError>;
}

/// The decision of `acquire` on a row (shared by both stores).
fn decide(row: &BreakerRow, policy: &BreakerPolicy, now: i64) -> Decision {
    match row.state {
        State::Closed => Decision::Allow,
        State::Open if now >= row.opened_at.saturating_add(ms(policy.cooldown)) => {
            Decision::TryProbe
        }
        State::HalfOpen if now >= row.probe_until => Decision::TryProbe,
        State::Open | State::HalfOpen => Decision::Refuse,
    }
}

enum Decision {
    Allow,
    TryProbe,
    Refuse,
}

/// Applies a counted failure to a row (the memory store; the SQL store does the same in SQL).
fn fail(row: &mut BreakerRow, policy: &BreakerPolicy, now: i64) {
    match row.state {
        State::HalfOpen => {
            row.state = State::Open;
            row.opened_at = now;
        }
        State::Open => {}
        State::Closed => {
            if row.window_start <= now - ms(policy.window) {
                row.window_start = now;
                row.failures = 1;
            } else {
                row.failures = row.failures.saturating_add(1);
            }
            if row.failures >= policy.failures {
                row.state = State::Open;
                row.opened_at = now;
            }
        }
    }
}

/// Breakers in this process's memory.
#[derive(Debug, Clone, Default)]
pub struct MemoryBreakers {
    rows: Arc<Mutex<HashMap<String, BreakerRow>>>,
}

impl MemoryBreakers {
    /// No breaker yet (all closed).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, BreakerRow>) -> T) -> T {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut rows)
    }
}

#[async_trait]
impl BreakerStore for MemoryBreakers {
    async fn acquire(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<Permit, BreakerError> {
        Ok(self.with(|rows| {
            let Some(row) = rows.get_mut(provider) else {
                return Permit::Closed;
            };
            match decide(row, policy, now) {
                Decision::Allow => Permit::Closed,
                Decision::Refuse => Permit::Open,
                Decision::TryProbe => {
                    row.state = State::HalfOpen;
                    row.probe_until = now.saturating_add(ms(policy.probe_timeout));
                    Permit::Probe
                }
            }
        }))
    }

    async fn failure(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<(), BreakerError> {
        self.with(|rows| {
            let row = rows
                .entry(provider.to_owned())
                .or_insert_with(|| BreakerRow::new(provider, now));
            fail(row, policy, now);
        });
        Ok(())
    }

    async fn success(&self, provider: &str, permit: Permit, now: i64) -> Result<(), BreakerError> {
        if permit == Permit::Probe {
            self.with(|rows| {
                if let Some(row) = rows
                    .get_mut(provider)
                    .filter(|r| r.state == State::HalfOpen)
                {
                    *row = BreakerRow::new(provider, now);
                }
            });
        }
        Ok(())
    }

    async fn rows(&self) -> Result<Vec<BreakerRow>, BreakerError> {
        let mut rows: Vec<_> = self.with(|rows| rows.values().cloned().collect());
        rows.sort_by(|a, b| a.provider.cmp(&b.provider));
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy {
            failures: 3,
            window: Duration::from_secs(10),
            cooldown: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(60),
        }
    }

    async fn cycle(store: &dyn BreakerStore) {
        let p = policy();
        let t0 = 1_000_000;
        store.failure("a", &p, t0).await.expect("fail");
        store.failure("a", &p, t0 + 11_000).await.expect("fail");
        assert_eq!(
            store.acquire("a", &p, t0 + 11_000).await.expect("acquire"),
            Permit::Closed,
            "the first failure left the window"
        );
        store.failure("a", &p, t0 + 12_000).await.expect("fail");
        store.failure("a", &p, t0 + 13_000).await.expect("fail");
        assert_eq!(
            store.acquire("a", &p, t0 + 13_000).await.expect("acquire"),
            Permit::Open,
            "3 in the window"
        );
        assert_eq!(
            store.acquire("a", &p, t0 + 17_999).await.expect("acquire"),
            Permit::Open,
            "cooling down"
        );
        assert_eq!(
            store.acquire("a", &p, t0 + 18_000).await.expect("acquire"),
            Permit::Probe
        );
        assert_eq!(
            store.acquire("a", &p, t0 + 18_001).await.expect("acquire"),
            Permit::Open,
            "one prober"
        );
        store.failure("a", &p, t0 + 19_000).await.expect("fail");
        let rows = store.rows().await.expect("rows");
        assert_eq!(
            (rows[0].state, rows[0].opened_at),
            (State::Open, t0 + 19_000),
            "a failed probe reopens"
        );
        assert_eq!(
            store.acquire("a", &p, t0 + 24_000).await.expect("acquire"),
            Permit::Probe
        );
        store
            .success("a", Permit::Probe, t0 + 24_500)
            .await
            .expect("success");
        assert_eq!(
            store.acquire("a", &p, t0 + 24_600).await.expect("acquire"),
            Permit::Closed
        );
        assert_eq!(store.rows().await.expect("rows")[0].failures, 0);
        assert_eq!(
            store.acquire("b", &p, t0).await.expect("acquire"),
            Permit::Closed,
            "per provider"
        );
    }

    #[tokio::test]
    async fn memory_breaker_opens_half_opens_for_one_and_closes() {
        cycle(&MemoryBreakers::new()).await;
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_breaker_opens_half_opens_for_one_and_closes() {
        let dir = tempfile::tempdir().expect("dir");
        let dsn = format!("sqlite://{}?mode=rwc", dir.path().join("b.db").display());
        let store = SqlBreakers::connect(&dsn, None).await.expect("connect");
        cycle(&store).await;
    }
}
