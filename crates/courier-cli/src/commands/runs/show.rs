//! What `courier runs show|list|events` print: a run with its steps and events, a list of
//! runs, as tables or JSON.

use courier_runs::{Budget, Run, RunEvent, RunStatus, StepRecord, StepStatus, Usage, rfc3339_ms};

use crate::context::Ctx;
use crate::error::CliResult;
use crate::table::{Table, shorten};

pub(super) fn show(
    ctx: &Ctx<'_>,
    run: &Run,
    events: &[RunEvent],
    steps: &[StepRecord],
) -> CliResult {
    if ctx.json() {
        return ctx.print_json(&run.to_json_with_steps(events, steps));
    }
    let field = |k: &str, v: String| println!("{k:<19} {v}");
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    field("id", run.id.to_string());
    field("agent", run.agent.clone());
    field("status", run.status.to_string());
    field(
        "termination reason",
        opt(run.termination_reason.map(|t| t.to_string())),
    );
    field("error class", opt(run.error_class.map(|c| c.to_string())));
    field("requeues", run.requeue_count.to_string());
    field("claimed by", opt(run.claimed_by.clone()));
    field(
        "lease expires",
        if run.lease_expires > 0 {
            rfc3339_ms(run.lease_expires)
        } else {
            "-".into()
        },
    );
    field("created", rfc3339_ms(run.created_at));
    field("started", opt(run.started_at.map(rfc3339_ms)));
    field("finished", opt(run.finished_at.map(rfc3339_ms)));
    if let Some(pending) = &run.pending_effect {
        field("pending effect", pending.clone());
    }
    if let Some(wait) = wait_text(run) {
        field("waiting for", wait);
    }
    field("budget", budget_text(run.budget.as_ref(), &run.usage, run));
    field("usage", usage_text(&run.usage));
    field("steps replayed", run.steps_replayed.to_string());
    field(
        "output",
        opt(run.output.as_ref().map(|o| shorten(&o.to_string(), 58))),
    );
    if !steps.is_empty() {
        println!();
        print!("{}", steps_table(steps));
        for s in steps {
            // A pending wait's row holds its state, shown above as `waiting for`.
            let result = match (&s.error, &s.output) {
                (Some(error), _) => format!("error: {error}"),
                (None, Some(_)) if s.status == StepStatus::Waiting => continue,
                (None, Some(output)) => output.to_string(),
                (None, None) => continue,
            };
            println!(
                "  #{} {}: {}",
                s.index,
                s.name,
                shorten(&result, STEP_RESULT_CHARS)
            );
        }
    }
    if !events.is_empty() {
        println!();
        print!("{}", events_table(events));
    }
    Ok(())
}

/// How much of a step's result `runs show` prints (the whole is in `--format json`).
const STEP_RESULT_CHARS: usize = 200;

/// What a waiting run waits for: its signal and when it wakes (its sleep or its timeout).
fn wait_text(run: &Run) -> Option<String> {
    if run.status != RunStatus::Waiting {
        return None;
    }
    let wakes = run.to_json()["wakes_at"].as_str().map(str::to_owned);
    Some(match (&run.wait_signal, wakes) {
        (Some(signal), Some(at)) => format!("signal `{signal}` (times out at {at})"),
        (Some(signal), None) => format!("signal `{signal}` (no timeout)"),
        (None, Some(at)) => format!("a durable sleep, wakes at {at}"),
        (None, None) => "a wake-up".into(),
    })
}

/// `tokens_out 120/1000, turns 1/10` for each limit set; `unlimited` without one.
fn budget_text(budget: Option<&Budget>, used: &Usage, run: &Run) -> String {
    let Some(budget) = budget.filter(|b| !b.is_unlimited()) else {
        return "unlimited".into();
    };
    let wall = run.started_at.map_or(0, |start| {
        let end = run.finished_at.unwrap_or(run.updated_at);
        u64::try_from(end - start).unwrap_or(0)
    });
    [
        ("tokens_in", used.tokens_in, budget.tokens_in),
        ("tokens_out", used.tokens_out, budget.tokens_out),
        ("cost_micros", used.cost_micros, budget.cost_micros),
        ("tool_calls", used.tool_calls, budget.tool_calls),
        ("turns", used.turns, budget.turns),
        ("wall_time_ms", wall, budget.wall_time_ms),
    ]
    .into_iter()
    .filter_map(|(name, used, limit)| limit.map(|l| format!("{name} {used}/{l}")))
    .collect::<Vec<_>>()
    .join(", ")
}

/// The non-zero parts of a usage, `-` when nothing was used.
fn usage_text(usage: &Usage) -> String {
    let parts: Vec<String> = [
        ("in", usage.tokens_in),
        ("out", usage.tokens_out),
        ("cost", usage.cost_micros),
        ("tools", usage.tool_calls),
        ("turns", usage.turns),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k} {n}"))
    .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// The journal: one row per step (its result is printed below the table).
fn steps_table(steps: &[StepRecord]) -> String {
    let mut table = Table::new(&["STEP", "NAME", "EFFECT", "STATUS", "MS", "RAN", "USAGE"])
        .flexible(6)
        .flexible(1);
    for s in steps {
        table.row(vec![
            s.index.to_string(),
            s.name.clone(),
            s.effect.clone(),
            s.status.as_str().to_owned(),
            s.duration_ms.to_string(),
            s.attempts.to_string(),
            usage_text(&s.usage),
        ]);
    }
    table.render()
}

pub(super) fn events_table(events: &[RunEvent]) -> String {
    let mut table = Table::new(&["SEQ", "KIND", "AT", "PAYLOAD"]).flexible(3);
    for e in events {
        table.row(vec![
            e.seq.to_string(),
            e.kind.clone(),
            rfc3339_ms(e.created_at),
            e.payload.to_string(),
        ]);
    }
    table.render()
}

pub(super) fn list(ctx: &Ctx<'_>, runs: &[Run]) -> CliResult {
    if ctx.json() {
        return ctx.print_json(&runs.iter().map(Run::to_json).collect::<Vec<_>>());
    }
    if runs.is_empty() {
        println!("No runs.");
        return Ok(());
    }
    let mut table = Table::new(&["ID", "STATUS", "AGENT", "REQ", "REASON"])
        .flexible(4)
        .flexible(2);
    for r in runs {
        table.row(vec![
            r.id.to_string(),
            r.status.to_string(),
            r.agent.clone(),
            r.requeue_count.to_string(),
            r.termination_reason
                .map_or_else(|| "-".into(), |t| t.to_string()),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}
