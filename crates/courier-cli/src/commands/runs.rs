//! `courier runs submit|show|list|events|cancel|requeue` and `courier reap`.

use std::sync::Arc;

use courier_runs::{
    Enqueued, InvalidUnique, ManualRequeue, ReapOptions, Run, RunError, RunEvent, RunStatus,
    RunStore, RunsConfig, Runtime, UniqueKey, rfc3339_ms,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::cli::{ReapArgs, RunsCommand};
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
            let input = parse_input(input)?;
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
            show(ctx, &run, &events)
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
    }
}

/// `--input JSON` or `--input @FILE`.
fn parse_input(input: &str) -> CliResult<Value> {
    let (text, from) = match input.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .map_err(|e| CliError::usage(format!("--input: cannot read `{path}`: {e}")))?,
            format!(" in `{path}`"),
        ),
        None => (input.to_owned(), String::new()),
    };
    serde_json::from_str(&text)
        .map_err(|e| CliError::usage(format!("--input: invalid JSON{from}: {e}")))
}

fn parse_id(id: &str) -> CliResult<Uuid> {
    Uuid::parse_str(id)
        .map_err(|_| CliError::usage(format!("invalid run id `{id}` (expected a UUID)")))
}

fn runtime_error(e: impl std::error::Error + 'static) -> CliError {
    CliError::runtime(chain(&e))
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

fn show(ctx: &Ctx<'_>, run: &Run, events: &[RunEvent]) -> CliResult {
    if ctx.json() {
        return ctx.print_json(&run.to_json_with_events(events));
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
    field(
        "output",
        opt(run.output.as_ref().map(|o| shorten(&o.to_string(), 58))),
    );
    if !events.is_empty() {
        println!();
        print!("{}", events_table(events));
    }
    Ok(())
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
