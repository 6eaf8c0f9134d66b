//! What the chaos workers run: the plain message [`ChaosItem`] and the durable agent
//! [`ChaosAgent`], both recording into the [`sink`](crate::sink).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier_core::Message;
use courier_runs::{Agent, AgentError, AgentOutcome, RunContext, Step, StepError, async_trait};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The plain message: its handler records `id` in the sink, once per handling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChaosItem {
    /// The message's number, 0..N per scenario.
    pub id: u64,
}

impl Message for ChaosItem {
    const NAME: &'static str = "chaos.item";
}

/// An agent that plays `{"steps": K, "sleep_ms": MS}`: K steps of MS ms each, every step
/// persisted with its owner (`pid:random`, one per execution) in the payload, so the harness can
/// prove from the run's events that no two executions of a run overlapped.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChaosAgent;

#[async_trait]
impl Agent for ChaosAgent {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let steps = cx.input().get("steps").and_then(Value::as_u64).unwrap_or(3);
        let sleep = cx
            .input()
            .get("sleep_ms")
            .and_then(Value::as_u64)
            .unwrap_or(100);
        let owner = format!("{}:{:08x}", std::process::id(), fastrand::u32(..));
        for i in 0..steps {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(sleep)) => {}
                () = cx.cancellation().cancelled() => return Err(StepError::LeaseLost.into()),
            }
            cx.checkpoint(Step::new("chaos", json!({ "owner": owner, "i": i })))
                .await?;
        }
        Ok(AgentOutcome::Completed(json!({ "owner": owner })))
    }
}

/// The scale measurement's message (`scripts/scale`): its handler does nothing, so a worker's
/// rate is the transport's and the framework's, not a handler's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleTick {
    /// The message's number, 0..N per measurement.
    pub seq: u64,
}

impl Message for ScaleTick {
    const NAME: &'static str = "scale.tick";
}

static TICKS: Mutex<Vec<i64>> = Mutex::new(Vec::new());

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The `scale.tick` handler's work: remembers when this process handled it (wall clock in
/// microseconds, shared by every namespace host), for [`ticks`].
pub fn record_tick() {
    if let Ok(mut t) = TICKS.lock() {
        t.push(now_us());
    }
}

/// When this process handled each `scale.tick`, microseconds since the Unix epoch, in order.
#[must_use]
pub fn ticks() -> Vec<i64> {
    TICKS.lock().map(|t| t.clone()).unwrap_or_default()
}

/// The environment variable naming the file `chaos-worker` writes [`ticks`] to at exit (one
/// number a line), read by the scale measurement.
pub const TICKS_ENV: &str = "SCALE_TICKS";
