//! The scripted runs the demo submits: a realistic mix, and one long run whose worker gets killed.

use std::time::Duration;

use serde_json::{Value, json};

/// Steps of the run whose worker process gets killed: long enough to be caught mid-run.
pub(super) const CRASH_STEPS: u64 = 10;
/// The length of each of those steps.
const CRASH_STEP: Duration = Duration::from_millis(200);
/// The worker is killed once the run has journaled this many steps (so, mid-run).
pub(super) const CRASH_AFTER_STEPS: usize = 2;

/// The input of the run whose worker gets killed: `CRASH_STEPS` durable steps of
/// `CRASH_STEP` each, journaled: the worker that resumes it replays those the killed one
/// finished and runs the rest.
pub(super) fn crash_run() -> Value {
    let ms = u64::try_from(CRASH_STEP.as_millis()).unwrap_or(u64::MAX);
    let mut steps: Vec<Value> = (1..=CRASH_STEPS)
        .map(|i| json!({ "step": format!("step {i}"), "ms": ms, "effect": "idempotent" }))
        .collect();
    steps.push(json!({ "output": "finished by another worker after a crash" }));
    json!({ "steps": steps })
}

/// The input of the other runs, `i` counting from 1.
///
/// Every 20 consecutive runs hold the whole mix, spread out: 65 % succeed, 15 % fail transiently
/// once or twice, 5 % each: 401, 400, budget exhausted, effect then failure.
pub(super) fn run(i: u32, rng: &mut fastrand::Rng) -> Value {
    let sleep = |rng: &mut fastrand::Rng| json!({ "sleep_ms": rng.u64(2..15) });
    let mut steps: Vec<Value> = (0..rng.usize(1..4)).map(|_| sleep(rng)).collect();
    let transient = ["server_error", "rate_limit", "connection"];
    match (i * 7) % 20 {
        0..=12 => {}
        13..=15 => {
            steps.push(json!({ "fail": transient[rng.usize(..3)], "attempts": rng.u32(1..3) }))
        }
        16 => steps.push(json!({ "fail": "auth" })),
        17 => steps.push(json!({ "fail": "client_error" })),
        18 => steps.push(json!({ "fail": "server_error" })),
        _ => {
            steps.push(json!({ "effect": "non_idempotent" }));
            steps.push(json!({ "fail": "connection", "attempts": 1 }));
        }
    }
    steps.push(sleep(rng));
    steps.push(json!({ "output": { "answer": i } }));
    json!({ "steps": steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_runs_hold_every_kind_of_ending() {
        let mut rng = fastrand::Rng::with_seed(7);
        let fails: Vec<String> = (1..=20)
            .filter_map(|i| {
                let input = run(i, &mut rng);
                let steps = input["steps"].as_array()?.clone();
                steps
                    .iter()
                    .find_map(|s| s.get("fail").and_then(Value::as_str).map(str::to_owned))
            })
            .collect();
        for class in ["auth", "client_error", "server_error", "connection"] {
            assert!(fails.iter().any(|f| f == class), "{class} in {fails:?}");
        }
    }

    #[test]
    fn the_crash_run_outlasts_the_steps_before_the_kill() {
        let steps = crash_run()["steps"].as_array().map_or(0, Vec::len);
        assert!(steps > CRASH_AFTER_STEPS + 3, "{steps} steps");
    }
}
