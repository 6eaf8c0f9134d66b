//! Runs, events and steps as JSON: the shapes of `courier runs show|list|events --format json` and the
//! dashboard's `/api/runs`: absent values are `null`, never omitted; times are
//! RFC 3339 strings except `lease_expires` (epoch ms, as stored).

pub use courier_core::rfc3339_ms;
use serde_json::{Value, json};

use super::{Run, RunEvent};
use crate::{RunStatus, StepRecord};

fn ms(v: Option<i64>) -> Value {
    v.map_or(Value::Null, |t| Value::String(rfc3339_ms(t)))
}

impl Run {
    /// The run as `runs show` (without `events`) and `runs list` print it.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "agent": self.agent,
            "status": self.status.as_str(),
            "termination_reason": self.termination_reason.map(|t| t.as_str()),
            "requeue_count": self.requeue_count,
            "claimed_by": self.claimed_by,
            "lease_expires": self.lease_expires,
            "error_class": self.error_class.map(|c| c.as_str()),
            "output": self.output,
            "input": self.input,
            "pending_effect": self.pending_effect,
            "created_at": rfc3339_ms(self.created_at),
            "started_at": ms(self.started_at),
            "finished_at": ms(self.finished_at),
            "updated_at": rfc3339_ms(self.updated_at),
            // When a queued run is due (the reaper re-dispatches it well past that); null otherwise.
            "due_at": (self.status == RunStatus::Queued).then(|| rfc3339_ms(self.due_at)),
            // When a run in a durable wait wakes (its sleep, or its signal's timeout); null otherwise.
            "wakes_at": (self.status == RunStatus::Waiting && self.due_at < crate::step::FOREVER)
                .then(|| rfc3339_ms(self.due_at)),
            "wait_signal": self.wait_signal,
            "concurrency_key": self.concurrency_key,
            "budget": self.budget,
            "usage": self.usage,
            "steps_replayed": self.steps_replayed,
        })
    }

    /// The run with its events, as `runs show` prints it.
    #[must_use]
    pub fn to_json_with_events(&self, events: &[RunEvent]) -> Value {
        let mut value = self.to_json();
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "events".into(),
                Value::Array(events.iter().map(RunEvent::to_json).collect()),
            );
        }
        value
    }

    /// The run with its events and its step journal, as `runs show` prints it and the
    /// dashboard's `/api/runs/{id}` answers.
    #[must_use]
    pub fn to_json_with_steps(&self, events: &[RunEvent], steps: &[StepRecord]) -> Value {
        let mut value = self.to_json_with_events(events);
        if let Some(obj) = value.as_object_mut() {
            obj.insert(
                "steps".into(),
                Value::Array(steps.iter().map(StepRecord::to_json).collect()),
            );
        }
        value
    }
}

impl StepRecord {
    /// The step as `runs show` prints it (in `steps`): `{"index", "name", "effect", "status",
    /// "output", "error", "error_class", "usage", "duration_ms", "attempts", "created_at",
    /// "finished_at"}`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "index": self.index,
            "name": self.name,
            "effect": self.effect,
            "status": self.status.as_str(),
            "output": self.output,
            "error": self.error,
            "error_class": self.error_class,
            "usage": self.usage,
            "duration_ms": self.duration_ms,
            "attempts": self.attempts,
            "created_at": rfc3339_ms(self.created_at),
            "finished_at": ms(self.finished_at),
        })
    }
}

impl RunEvent {
    /// The event as `runs events` prints it: `{"seq", "kind", "payload", "created_at"}`.
    #[must_use]
    pub fn to_json(&self) -> Value {
        json!({
            "seq": self.seq,
            "kind": self.kind,
            "payload": self.payload,
            "created_at": rfc3339_ms(self.created_at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_values_are_null_and_times_rfc3339() {
        let run = Run {
            id: uuid::Uuid::nil(),
            agent: "scripted".into(),
            status: RunStatus::Queued,
            input: json!({}),
            output: None,
            error_class: None,
            termination_reason: None,
            claimed_by: None,
            lease_expires: 0,
            requeue_count: 0,
            pending_effect: None,
            created_at: 1_000,
            started_at: None,
            finished_at: None,
            updated_at: 1_000,
            due_at: 1_000,
            budget: None,
            usage: crate::Usage::default(),
            steps_replayed: 0,
            wait_signal: None,
            concurrency_key: None,
            journaled: None,
        };
        let v = run.to_json_with_events(&[]);
        assert_eq!(v["created_at"], "1970-01-01T00:00:01.000Z");
        assert_eq!(v["started_at"], Value::Null);
        assert_eq!(v["termination_reason"], Value::Null);
        assert_eq!(v["events"], json!([]));
        assert_eq!(v["due_at"], "1970-01-01T00:00:01.000Z");
        let step = StepRecord {
            run_id: run.id,
            index: 2,
            name: "pay".into(),
            effect: "guarded".into(),
            status: crate::StepStatus::Intent,
            output: None,
            error: None,
            error_class: None,
            usage: crate::Usage::tokens(3, 4),
            duration_ms: 0,
            attempts: 1,
            created_at: 2_000,
            finished_at: None,
        };
        let v = run.to_json_with_steps(&[], &[step]);
        assert_eq!(v["events"], json!([]));
        let s = &v["steps"][0];
        assert_eq!(
            (s["index"].as_i64(), s["status"].as_str()),
            (Some(2), Some("intent"))
        );
        assert_eq!(s["usage"]["tokens_out"], 4);
        assert_eq!(s["output"], Value::Null);
        assert_eq!(s["finished_at"], Value::Null);
        assert_eq!(s["created_at"], "1970-01-01T00:00:02.000Z");
    }
}
