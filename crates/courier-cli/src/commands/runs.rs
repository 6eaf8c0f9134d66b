//! `courier runs submit|show|list|events|cancel|requeue|signal|resolve|fork|approve|input` and
//! `courier reap`.

use std::sync::Arc;

use courier_runs::{
    Enqueued, InvalidUnique, ManualRequeue, NewRun, Outcome, ReapOptions, Resolution, Run,
    RunError, RunEvent, RunStatus, RunStore, RunsConfig, Runtime, SignalSent, StepStatus,
    UniqueKey,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::cli::{ReapArgs, ResolveAction, RunsCommand};
use crate::context::Ctx;
use crate::error::{CliError, CliResult, chain};
use crate::runs::{open_store, runtime, settings};

mod show;

use show::{events_table, list, show};

pub(crate) async fn run(ctx: &Ctx<'_>, command: &RunsCommand) -> CliResult {
    let config = settings(ctx)?;
    match command {
        RunsCommand::Submit {
            agent,
            input,
            interactive,
            unique,
            unique_for,
            concurrency_key,
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
            let mut new_run = NewRun::new(agent.as_str(), input);
            if let Some(key) = concurrency_key {
                new_run = new_run
                    .with_concurrency_key(key.as_str())
                    .map_err(|e| CliError::usage(format!("--concurrency-key: {e}")))?;
            }
            submit(ctx, &config, new_run, *interactive, unique).await
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
    new_run: NewRun,
    interactive: bool,
    unique: Option<UniqueKey>,
) -> CliResult {
    let (agent, input) = (new_run.agent.as_str(), new_run.input.clone());
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
        None => runtime.submit(new_run.clone()).await.map(Enqueued::Queued),
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
