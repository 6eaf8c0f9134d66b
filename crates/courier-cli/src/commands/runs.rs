//! `courier runs submit|show|list|events|cancel|requeue|signal|resolve|fork|approve|input` and
//! `courier reap`.

use std::sync::Arc;

use courier_runs::{
    Budget, Enqueued, InvalidUnique, ManualRequeue, Outcome, ReapOptions, Resolution, Run,
    RunError, RunEvent, RunStatus, RunStore, RunsConfig, Runtime, SignalSent, StepRecord,
    StepStatus, UniqueKey, Usage, rfc3339_ms,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::cli::{ReapArgs, ResolveAction, RunsCommand};
use crate::context::Ctx;
use crate::error::{CliError, CliResult, chain};
use crate::runs::{open_store, runtime, settings};
use crate::table::{Table, shorten};

pub(crate) async fn run(ctx: &Ctx<'_>, command: &RunsCommand) -> CliResult {
    let config = settings(ctx)?;
    match command {
        RunsCommand::Submit {
            agent,
            input,
            interactive,
            unique,
            unique_for,
        } => {
            let input = parse_json("--input", input)?;
            if !ctx.app.agents.contains(agent) {
                return Err(CliError::usage(format!(
                    "unknown agent `{agent}` (known: {})",
                    ctx.app.agents.names()
                )));
            }
            let unique = match (unique, unique_for) {
                (Some(key), Some(period)) => {
                    Some(UniqueKey::new(key.as_str(), *period).map_err(|e| {
                        let flag = match e {
                            InvalidUnique::ZeroPeriod { .. } => "--unique-for",
                            _ => "--unique",
                        };
                        CliError::usage(format!("{flag}: {e}"))
                    })?)
                }
                _ => None,
            };
            submit(ctx, &config, agent, input, *interactive, unique).await
        }
        RunsCommand::Show { id } => {
            let id = parse_id(id)?;
            let store = open_store(&config).await?;
            let run = find(&store, id).await?;
            let events = store.events(id).await.map_err(runtime_error)?;
            let steps = store.steps(id).await.map_err(runtime_error)?;
            show(ctx, &run, &events, &steps)
        }
        RunsCommand::List { status, limit } => {
            let status = status
                .as_deref()
                .map(|s| {
                    s.parse::<RunStatus>()
                        .map_err(|e| CliError::usage(format!("--status: {e}")))
                })
                .transpose()?;
            let store = open_store(&config).await?;
            let runs = store.list(status, *limit).await.map_err(runtime_error)?;
            list(ctx, &runs)
        }
        RunsCommand::Events { id } => {
            let id = parse_id(id)?;
            let store = open_store(&config).await?;
            find(&store, id).await?;
            let events = store.events(id).await.map_err(runtime_error)?;
            if ctx.json() {
                return ctx.print_json(&events.iter().map(RunEvent::to_json).collect::<Vec<_>>());
            }
            print!("{}", events_table(&events));
            Ok(())
        }
        RunsCommand::Requeue { id } => {
            let id = parse_id(id)?;
            requeue(ctx, &config, id).await
        }
        RunsCommand::Cancel { id } => {
            let id = parse_id(id)?;
            let store = open_store(&config).await?;
            let cancelled = store.cancel(id).await.map_err(runtime_error)?;
            let run = find(&store, id).await?;
            if ctx.json() {
                ctx.print_json(
                    &json!({ "id": id, "cancelled": cancelled, "status": run.status.as_str() }),
                )?;
            } else if cancelled {
                println!("Cancelled run {id}.");
            }
            if !cancelled {
                return Err(CliError::runtime(format!(
                    "run {id} is already {}; nothing to cancel",
                    run.status
                )));
            }
            Ok(())
        }
        RunsCommand::Prune {
            older_than,
            status,
            batch,
        } => prune(ctx, &config, *older_than, status, *batch).await,
        RunsCommand::Signal { id, name, data, by } => {
            let id = parse_id(id)?;
            let data = parse_json("--data", data)?;
            signal(ctx, &config, id, name, data, by.as_deref()).await
        }
        RunsCommand::Resolve { id, action, result } => {
            let id = parse_id(id)?;
            let resolution = match (action, result) {
                (ResolveAction::Skip, result) => Resolution::Skip(match result {
                    Some(r) => parse_json("--result", r)?,
                    None => Value::Null,
                }),
                (_, Some(_)) => {
                    return Err(CliError::usage(
                        "--result: only `skip` takes a result (the step's, instead of running it)",
                    ));
                }
                (ResolveAction::Retry, None) => Resolution::Retry,
                (ResolveAction::Fail, None) => Resolution::Fail,
            };
            resolve(ctx, &config, id, resolution).await
        }
        RunsCommand::Fork { id, from_step } => {
            let id = parse_id(id)?;
            fork(ctx, &config, id, *from_step).await
        }
        RunsCommand::Approve { id } => {
            let id = parse_id(id)?;
            resume(ctx, &config, id, None).await
        }
        RunsCommand::Input { id, data } => {
            let id = parse_id(id)?;
            let data = parse_json("--data", data)?;
            resume(ctx, &config, id, Some(data)).await
        }
    }
}

/// `--flag JSON` or `--flag @FILE` (`flag` names the option in errors).
fn parse_json(flag: &str, input: &str) -> CliResult<Value> {
    let (text, from) = match input.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| CliError::usage(format!("{flag}: cannot read `{path}`: {e}")))?,
            format!(" in `{path}`"),
        ),
        None => (input.to_owned(), String::new()),
    };
    serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("{flag}: invalid JSON{from}: {e}")))
}

fn parse_id(id: &str) -> CliResult<Uuid> {
    Uuid::parse_str(id)
        .map_err(|_| CliError::usage(format!("invalid run id `{id}` (expected a UUID)")))
}

fn runtime_error(e: impl std::error::Error + 'static) -> CliError {
    CliError::runtime(chain(&e))
}

/// `courier runs prune`: batches of finished runs deleted until one comes back short.
async fn prune(
    ctx: &Ctx<'_>,
    config: &RunsConfig,
    older_than: std::time::Duration,
    status: &[String],
    batch: u64,
) -> CliResult {
    let statuses = if status.is_empty() {
        courier_runs::PRUNABLE.to_vec()
    } else {
        status
            .iter()
            .map(|s| {
                let parsed: RunStatus = s.parse().map_err(|e| {
                    CliError::usage(format!("--status: {e} (completed, failed or cancelled)"))
                })?;
                if parsed.is_terminal() {
                    Ok(parsed)
                } else {
                    Err(CliError::usage(format!(
                        "--status: `{s}` is not a finished status; only completed, failed and \
                         cancelled runs are pruned"
                    )))
                }
            })
            .collect::<CliResult<Vec<_>>>()?
    };
    let store = open_store(config).await?;
    let batch = usize::try_from(batch).unwrap_or(500);
    let mut deleted = 0;
    loop {
        let n = store
            .prune(older_than, &statuses, batch)
            .await
            .map_err(runtime_error)?;
        deleted += n;
        if n < batch as u64 {
            break;
        }
    }
    let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
    if ctx.json() {
        return ctx.print_json(&json!({
            "deleted": deleted,
            "older_than": humantime::format_duration(older_than).to_string(),
            "statuses": names,
        }));
    }
    println!(
        "Deleted {deleted} run(s) ({}) finished more than {} ago, with their events and steps.",
        names.join(", "),
        humantime::format_duration(older_than)
    );
    Ok(())
}

async fn find(store: &Arc<dyn RunStore>, id: Uuid) -> CliResult<Run> {
    store
        .find(id)
        .await
        .map_err(runtime_error)?
        .ok_or_else(|| CliError::runtime(format!("run {id} not found")))
}

async fn submit(
    ctx: &Ctx<'_>,
    config: &RunsConfig,
    agent: &str,
    input: Value,
    interactive: bool,
    unique: Option<UniqueKey>,
) -> CliResult {
    let store = open_store(config).await?;
    let runtime: Runtime = runtime(ctx, config, store.clone());
    if interactive {
        let (id, result) = match runtime.run(agent, input).await {
            Ok((id, outcome)) => (id, Ok(outcome)),
            Err(RunError::Agent { run_id, error }) => (run_id, Err(chain(&error))),
            Err(e) => return Err(runtime_error(e)),
        };
        let run = find(&store, id).await?;
        if ctx.json() {
            ctx.print_json(&json!({ "id": id, "status": run.status.as_str() }))?;
        } else {
            println!("{id}");
            ctx.note(format!("Run {id} is {}.", run.status));
        }
        return result
            .map(|_| ())
            .map_err(|e| CliError::runtime(format!("run {id} failed: {e}")));
    }
    let transports = ctx.connect().await?;
    let _bus = ctx.bus(&transports, |b| runtime.register(b));
    let enqueued = match &unique {
        Some(unique) => runtime.enqueue_unique(agent, input, unique.clone()).await,
        None => runtime.enqueue(agent, input).await.map(Enqueued::Queued),
    };
    let enqueued = enqueued.map_err(|e| match e {
        RunError::Dispatch { run_id, source } => CliError::runtime(format!(
            "could not queue run {run_id} (is `courier.run_agent` routed to a transport?): {}",
            chain(&source)
        )),
        other => runtime_error(other),
    })?;
    let (id, duplicate) = (enqueued.id(), enqueued.is_duplicate());
    if ctx.json() {
        if unique.is_some() {
            return ctx.print_json(&json!({ "id": id, "duplicate": duplicate }));
        }
        return ctx.print_json(&json!({ "id": id }));
    }
    println!("{id}");
    if let (true, Some(unique)) = (duplicate, &unique) {
        ctx.note(format!(
            "Run {id} holds the unique key `{}`: nothing was queued.",
            unique.key()
        ));
    }
    Ok(())
}

fn show(ctx: &Ctx<'_>, run: &Run, events: &[RunEvent], steps: &[StepRecord]) -> CliResult {
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

fn events_table(events: &[RunEvent]) -> String {
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

fn list(ctx: &Ctx<'_>, runs: &[Run]) -> CliResult {
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

pub(crate) async fn reap(ctx: &Ctx<'_>, args: &ReapArgs) -> CliResult {
    let config = settings(ctx)?;
    if args.limit == Some(0) {
        return Err(CliError::usage("--limit: must be at least 1"));
    }
    let store = open_store(&config).await?;
    let runtime = runtime(ctx, &config, store);
    let transports = ctx.connect().await?;
    let _bus = ctx.bus(&transports, |b| runtime.register(b));
    let options = ReapOptions {
        limit: args.limit.unwrap_or(config.reap_limit),
        dry_run: args.dry_run,
    };
    let report = runtime
        .reaper()
        .reap(options)
        .await
        .map_err(runtime_error)?;
    if ctx.json() {
        return ctx.print_json(&json!({
            "selected": report.selected,
            "requeued": report.requeued,
            "dead_lettered": report.dead_lettered,
            "skipped": report.skipped,
            "redispatched": report.redispatched,
            "dry_run": args.dry_run,
        }));
    }
    if args.dry_run {
        println!("Dry run, nothing changed. {report}");
    } else {
        println!("{report}");
    }
    Ok(())
}

/// `courier runs requeue ID`: the operator's re-dispatch (queued) or requeue (lease expired).
async fn requeue(ctx: &Ctx<'_>, config: &RunsConfig, id: Uuid) -> CliResult {
    let store = open_store(config).await?;
    let runtime = runtime(ctx, config, store);
    let transports = ctx.connect().await?;
    let _bus = ctx.bus(&transports, |b| runtime.register(b));
    let done = runtime.reaper().requeue(id).await.map_err(runtime_error)?;
    let (action, text) = match done {
        ManualRequeue::Redispatched => ("redispatched", format!("Re-dispatched queued run {id}.")),
        ManualRequeue::Requeued => (
            "requeued",
            format!("Requeued run {id} (its lease had expired) and dispatched it."),
        ),
        _ => ("requeued", format!("Requeued run {id}.")),
    };
    if ctx.json() {
        return ctx.print_json(&json!({ "id": id, "action": action }));
    }
    println!("{text}");
    Ok(())
}

/// A runtime over the configuration's store, registered on its bus (a woken, released or
/// forked run is dispatched there), and the bus, kept alive while the runtime is used.
async fn connected_runtime(
    ctx: &Ctx<'_>,
    config: &RunsConfig,
) -> CliResult<(Runtime, courier_core::MessageBus)> {
    let store = open_store(config).await?;
    let runtime = runtime(ctx, config, store);
    let transports = ctx.connect().await?;
    let bus = ctx.bus(&transports, |b| runtime.register(b));
    Ok((runtime, bus))
}

/// The error of a runtime call on an existing run, naming what the operator can do.
fn run_error(e: RunError) -> CliError {
    match e {
        RunError::Dispatch { run_id, source } => CliError::runtime(format!(
            "run {run_id} is queued but its message could not be sent (is `courier.run_agent` \
             routed to a transport?); `courier reap` dispatches it again: {}",
            chain(&source)
        )),
        other => runtime_error(other),
    }
}

/// `courier runs signal ID NAME [--data JSON] [--by WHO]`.
async fn signal(
    ctx: &Ctx<'_>,
    config: &RunsConfig,
    id: Uuid,
    name: &str,
    data: Value,
    by: Option<&str>,
) -> CliResult {
    let (runtime, _bus) = connected_runtime(ctx, config).await?;
    let sent = runtime
        .signal(id, name, data, by)
        .await
        .map_err(|e| match e {
            RunError::WrongStatus { run_id, status, .. } => CliError::runtime(format!(
                "run {run_id} is {status}: a finished run takes no signal"
            )),
            other => run_error(other),
        })?;
    let (state, text) = match sent {
        SignalSent::Woken => (
            "woken",
            format!("Signal `{name}` woke run {id}: it is queued again."),
        ),
        _ => (
            "buffered",
            format!(
                "Signal `{name}` recorded for run {id}: it is not waiting yet, its wait will \
                 find it."
            ),
        ),
    };
    if ctx.json() {
        return ctx.print_json(&json!({ "id": id, "signal": name, "sent": state }));
    }
    println!("{text}");
    Ok(())
}

/// `courier runs resolve ID retry|skip|fail [--result JSON]`.
async fn resolve(
    ctx: &Ctx<'_>,
    config: &RunsConfig,
    id: Uuid,
    resolution: Resolution,
) -> CliResult {
    let (runtime, _bus) = connected_runtime(ctx, config).await?;
    let parked = runtime
        .store()
        .find(id)
        .await
        .map_err(runtime_error)?
        .and_then(|r| r.pending_effect);
    let action = match &resolution {
        Resolution::Retry => "retry",
        Resolution::Skip(_) => "skip",
        _ => "fail",
    };
    let outcome = runtime
        .resolve_step(id, resolution)
        .await
        .map_err(|e| match e {
            RunError::WrongStatus { run_id, status, .. } => CliError::runtime(format!(
                "run {run_id} is {status}, not parked on a guarded step (waiting_for_approval \
                 with a step's intent): nothing to resolve"
            )),
            other => run_error(other),
        })?;
    let status = match outcome {
        Outcome::Failed { .. } => RunStatus::Failed,
        _ => RunStatus::Queued,
    };
    if ctx.json() {
        return ctx.print_json(&json!({
            "id": id,
            "resolution": action,
            "step": parked,
            "status": status.as_str(),
        }));
    }
    let step = parked.unwrap_or_else(|| "the parked step".into());
    match action {
        "retry" => println!("Run {id}: {step} runs again with the same key; the run is queued."),
        "skip" => println!("Run {id}: {step} skipped with the given result; the run is queued."),
        _ => println!("Run {id} failed at {step} (class ambiguous_effect)."),
    }
    Ok(())
}

/// `courier runs fork ID --from-step N`: prints the new run's id.
async fn fork(ctx: &Ctx<'_>, config: &RunsConfig, id: Uuid, from_step: i64) -> CliResult {
    let (runtime, _bus) = connected_runtime(ctx, config).await?;
    let new = runtime.fork(id, from_step).await.map_err(run_error)?;
    if ctx.json() {
        return ctx.print_json(&json!({ "id": new, "forked_from": id, "from_step": from_step }));
    }
    println!("{new}");
    ctx.note(format!(
        "Run {new} forked from {id}: steps before {from_step} replay its journal."
    ));
    Ok(())
}

/// `courier runs approve ID` (no input) and `courier runs input ID --data JSON`: resume the
/// run here, in this process, until it ends or stops again.
async fn resume(ctx: &Ctx<'_>, config: &RunsConfig, id: Uuid, input: Option<Value>) -> CliResult {
    let (runtime, _bus) = connected_runtime(ctx, config).await?;
    let parked = parked_step(runtime.store(), id).await?;
    if let (Some(step), None) = (parked, &input) {
        return Err(CliError::runtime(format!(
            "run {id} is parked on {step}, a guarded step that may or may not have taken effect: \
             resolve it with `courier runs resolve {id} retry|skip|fail`"
        )));
    }
    let resumed = match input {
        Some(input) => runtime.provide_input(id, input).await,
        None => runtime.approve(id).await,
    };
    let failed = match resumed {
        Ok(_) => None,
        Err(RunError::Agent { error, .. }) => Some(chain(&error)),
        Err(RunError::WrongStatus {
            run_id,
            status,
            expected,
        }) => {
            return Err(CliError::runtime(format!(
                "run {run_id} is {status}, not {expected}: nothing to resume"
            )));
        }
        Err(RunError::UnknownAgent(agent)) => {
            return Err(CliError::usage(format!(
                "run {id} belongs to agent `{agent}`, which this application does not register \
                 (known: {})",
                ctx.app.agents.names()
            )));
        }
        Err(e) => return Err(run_error(e)),
    };
    let run = find(runtime.store(), id).await?;
    if ctx.json() {
        ctx.print_json(&json!({ "id": id, "status": run.status.as_str() }))?;
    } else {
        println!("Run {id} is {}.", run.status);
    }
    match failed {
        Some(e) => Err(CliError::runtime(format!("run {id} failed: {e}"))),
        None => Ok(()),
    }
}

/// The guarded step a run `waiting_for_approval` is parked on (`step N: name`), if it is.
async fn parked_step(store: &Arc<dyn RunStore>, id: Uuid) -> CliResult<Option<String>> {
    let run = find(store, id).await?;
    if run.status != RunStatus::WaitingForApproval {
        return Ok(None);
    }
    let steps = store.steps(id).await.map_err(runtime_error)?;
    Ok(steps
        .iter()
        .rev()
        .find(|s| s.status == StepStatus::Intent)
        .map(|s| format!("step {}: {}", s.index, s.name)))
}
