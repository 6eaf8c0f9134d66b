//! `courier consume`: run a worker until a limit, a signal or `stop-workers`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use courier_core::{
    CancellationToken, StopReason, WorkerError, WorkerEvent, WorkerRecord, WorkerStats,
};

use crate::cli::ConsumeArgs;
use crate::commands::progress::{Counters, progress};
use crate::commands::stop;
use crate::connect;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, scrub};

/// [`courier_core::Setup::check`] of every configured transport that has one.
async fn check_schemas(transports: &courier_core::config::Transports) -> CliResult {
    for transport in transports.all().values() {
        if let Some(setup) = transport.as_setup() {
            setup.check().await?;
        }
    }
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx<'_>, args: &ConsumeArgs) -> CliResult {
    ctx.check_transports(&args.transports)?;
    check_choice(ctx, args)?;
    #[cfg(feature = "runs")]
    let mut runs = crate::runs::WorkerParts::prepare(ctx, args.reap_every)?;
    #[cfg(not(feature = "runs"))]
    if args.reap_every.is_some() {
        return Err(CliError::usage("`--reap-every` needs the `runs` feature"));
    }
    // Bound and installed first: a bad address exits 2 at once, and every metric the worker
    // registers goes to this recorder.
    let exporter = match args.metrics {
        Some(addr) => Some(crate::metrics::Exporter::bind(addr).await?),
        None => None,
    };
    let worker_id = worker_id(args.worker_id.as_deref())?;
    let counters = Arc::new(Counters::new(ctx.config.transports.keys().cloned()));
    let shutdown = CancellationToken::new();
    let helpers = CancellationToken::new();
    // Signals are watched from the start: a worker still waiting for its servers stops too.
    let mut tasks: Vec<Helper> = vec![(
        "signal watcher",
        tokio::spawn(watch_signals(
            shutdown.clone(),
            helpers.clone(),
            args.grace,
            ctx.quiet,
            counters.clone(),
        )),
    )];
    let connected = connect::until_up(&shutdown, || ctx.try_connect()).await;
    let transports = match connected {
        Ok(Some(transports)) => transports,
        Ok(None) => return stopped_before_start(ctx, &helpers, tasks).await,
        Err(e) => {
            helpers.cancel();
            return Err(e);
        }
    };
    // A transport told not to set itself up (`auto_setup = false`) whose schema is missing or
    // older stops the worker here, naming the migration, not at its first message (exit 2).
    if let Err(e) = check_schemas(&transports).await {
        helpers.cancel();
        return Err(e);
    }
    #[cfg(feature = "runs")]
    match runs.connect(ctx, &shutdown).await {
        Ok(true) => {}
        Ok(false) => return stopped_before_start(ctx, &helpers, tasks).await,
        Err(e) => {
            helpers.cancel();
            return Err(e);
        }
    }
    let bus = ctx.bus(&transports, |b| {
        #[cfg(feature = "runs")]
        let b = runs.bus_hook(b);
        b
    });
    let verbose = ctx.verbose >= 1;
    let listen = counters.clone();
    let (receivers, relayed) = receivers(&transports, args).await?;
    let mut consumed: Vec<String> = Vec::new();
    for (name, _) in &receivers {
        if !consumed.contains(name) {
            consumed.push(name.clone());
        }
    }
    // Each receiver with a `rate_limit` fetches only what its bucket grants, each pausable one
    // nothing while `courier pause` says so, each with a `handler_timeout` drops a hung handler.
    let mut builder = transports.worker_on(bus.clone(), receivers)?;
    for other in ctx.other_buses(&transports) {
        if args.bus.as_deref() == Some(other.name()) {
            builder = builder.dispatch_to(other.clone());
        }
        builder = builder.bus(other);
    }
    if args.bus.as_deref() == Some(bus.name()) {
        builder = builder.dispatch_to(bus.clone());
    }
    let mut builder = builder
        .fetch_size(usize::from(args.fetch_size))
        .concurrency(usize::from(args.concurrency))
        .sleep(args.sleep)
        .keepalive(args.keepalive)
        .grace(args.grace)
        .listener(move |event| on_event(&listen, verbose, event));
    if let Some(n) = args.limit {
        builder = builder.limit(n);
    }
    if let Some(n) = args.failure_limit {
        builder = builder.failure_limit(n);
    }
    if let Some(t) = args.time_limit {
        builder = builder.time_limit(t);
    }
    if let Some(m) = args.memory_limit {
        builder = builder.memory_limit(m);
    }
    #[cfg(feature = "runs")]
    let run_handle = runs.runtime();
    #[cfg(not(feature = "runs"))]
    let run_handle = None;
    // Ticks are dispatched on the worker's bus: signed, deduplicated, traced like any dispatch.
    if let Some(scheduler) =
        crate::schedules::scheduler(ctx, &transports, &worker_id, run_handle, Some(bus))?
    {
        tasks.push(("scheduler", tokio::spawn(scheduler.run(helpers.clone()))));
    }
    match crate::registry::for_consume(ctx, &transports, &consumed).await {
        Some(found) => {
            tracing::info!(courier.worker.id = %worker_id, registry = %found.what,
                "registering in the worker registry");
            let record = WorkerRecord::new(
                worker_id,
                courier_core::worker::host_name(),
                std::process::id(),
                consumed,
            );
            builder = builder
                .registry(found.registry, record)
                .registry_heartbeat(args.registry_heartbeat);
        }
        None => {
            let path = ctx.stop_file();
            tracing::info!(stop_file = %path.display(),
                "no shared store for the worker registry: `courier stop-workers` reaches this worker through the stop file (same file system only)");
            tasks.push((
                "stop-file watcher",
                tokio::spawn(watch_stop_file(path, shutdown.clone(), helpers.clone())),
            ));
        }
    }
    let worker = builder.build();

    if !ctx.quiet && !ctx.json() {
        let names = if args.transports.is_empty() && !relayed.is_empty() {
            format!(
                "every transport but {} (cursor outboxes: `courier relay` reads them)",
                relayed.join(", ")
            )
        } else if args.transports.is_empty() {
            "every transport".to_owned()
        } else {
            args.transports.join(", ")
        };
        eprintln!("Consuming {names}; stop with Ctrl-C or `courier stop-workers`.");
        tasks.push((
            "progress",
            tokio::spawn(progress(counters.clone(), helpers.clone())),
        ));
    }
    if let Some(exporter) = exporter {
        let all = transports
            .all()
            .iter()
            .map(|(name, t)| (name.clone(), t.clone()))
            .collect();
        tasks.push(("metrics exporter", exporter.spawn(all, helpers.clone())));
        #[cfg(feature = "agent")]
        if let Some(store) = crate::agents::breaker_store(ctx)? {
            let every = crate::metrics::DEPTH_EVERY;
            let task = courier_agent::breaker::spawn_gauges(store, every, helpers.clone());
            tasks.push(("breaker gauges", task));
        }
    }
    #[cfg(feature = "runs")]
    if let Some(task) = runs.spawn_reaper(helpers.clone(), ctx.quiet) {
        tasks.push(("reaper", task));
    }

    let result = worker.run(shutdown.clone()).await;
    helpers.cancel();
    let joined = join_helpers(tasks).await;
    let stats = result.map_err(|e| match e {
        WorkerError::NoReceivers => {
            CliError::usage("nothing to consume: name a transport (`courier consume async`)")
        }
        other => CliError::usage(other.to_string()),
    })?;
    report(ctx, &stats)?;
    joined
}

/// `--exclude-receivers` and `--bus` name what the configuration has.
fn check_choice(ctx: &Ctx<'_>, args: &ConsumeArgs) -> CliResult {
    ctx.check_transports(&args.exclude_receivers)?;
    if !args.exclude_receivers.is_empty() && !args.transports.is_empty() {
        return Err(CliError::usage(
            "`--exclude-receivers` applies when no transport is named (consume all but these)",
        ));
    }
    if let Some(bus) = &args.bus {
        let default = ctx.config.default_bus_name();
        if bus != default && !ctx.config.buses.contains_key(bus) {
            let mut known: Vec<&str> = ctx.config.buses.keys().map(String::as_str).collect();
            if !known.contains(&default) {
                known.insert(0, default);
            }
            return Err(CliError::usage(format!(
                "--bus: unknown bus `{bus}` (configured: {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// The receivers in priority order: the named transports (else all but failure transports,
/// cursor outboxes and `--exclude-receivers`), each split into its `--queues` when given; and
/// the cursor outboxes left out.
async fn receivers(
    transports: &courier_core::config::Transports,
    args: &ConsumeArgs,
) -> CliResult<(Vec<(String, Arc<dyn courier_core::Transport>)>, Vec<String>)> {
    let (mut out, mut relayed) = (Vec::new(), Vec::new());
    for name in transports.receiver_names(&args.transports) {
        if args.exclude_receivers.contains(&name) {
            continue;
        }
        let Some(transport) = transports.get(&name) else {
            return Err(CliError::usage(format!("unknown transport `{name}`")));
        };
        if transport
            .as_relay_source()
            .is_some_and(courier_core::relay::RelaySource::relay_only)
        {
            // Read by `courier relay` alone: a worker's claims would take rows from under the
            // cursor. Left out of "every transport", refused by name.
            if args.transports.is_empty() {
                relayed.push(name);
                continue;
            }
            return Err(CliError::usage(format!(
                "transport `{name}` is a cursor outbox (cursor=true): `courier relay --from {name} --to ...` reads it; consume the relay's destination instead"
            )));
        }
        if args.queues.is_empty() {
            out.push((name, transport.clone()));
            continue;
        }
        let Some(queues) = transport.as_queues() else {
            return Err(CliError::usage(format!(
                "transport `{name}` has a single queue: --queues needs a transport with several (SQL, AMQP)"
            )));
        };
        for queue in &args.queues {
            out.push((name.clone(), queues.queue(queue).await?));
        }
    }
    Ok((out, relayed))
}

/// A task beside the worker (signals, stop file, progress line, reaper), named for its errors.
type Helper = (&'static str, tokio::task::JoinHandle<()>);

/// Waits for the helper tasks (once told to stop). One that panicked is logged at ERROR and
/// fails the command (exit 1): a reaper or progress line that died mid-run does not pass
/// unnoticed behind a successful exit.
async fn join_helpers(tasks: Vec<Helper>) -> CliResult {
    let mut failed = None;
    for (name, task) in tasks {
        match task.await {
            Ok(()) => {}
            Err(e) if e.is_panic() => {
                let message = scrub(&panic_message(e.into_panic().as_ref()));
                tracing::error!(task = name, panic = %message, "a consume task panicked");
                failed.get_or_insert_with(|| {
                    CliError::runtime(format!("the {name} task panicked: {message}"))
                });
            }
            Err(e) => tracing::warn!(task = name, error = %e, "a consume task was cancelled"),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// The worker id: `--worker-id`, checked, else `host:pid:random`.
fn worker_id(given: Option<&str>) -> CliResult<String> {
    let Some(id) = given else {
        return Ok(courier_core::worker::default_worker_id());
    };
    if id.is_empty() || id.len() > 190 || id.chars().any(char::is_control) {
        return Err(CliError::usage(
            "--worker-id: expected 1 to 190 bytes of printable text",
        ));
    }
    Ok(id.to_owned())
}

fn on_event(c: &Counters, verbose: bool, event: &WorkerEvent) {
    match event {
        WorkerEvent::Received {
            transport,
            message,
            id,
        } => {
            c.received.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = c.of(transport) {
                t.received.fetch_add(1, Ordering::Relaxed);
            }
            if verbose {
                tracing::info!(messaging.destination.name = %transport, courier.message.type = %message, messaging.message.id = id.as_deref().unwrap_or("-"), "received");
            }
        }
        WorkerEvent::Handled {
            transport,
            message,
            id,
            elapsed,
        } => {
            c.handled.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = c.of(transport) {
                t.handled.fetch_add(1, Ordering::Relaxed);
            }
            if verbose {
                tracing::info!(messaging.destination.name = %transport, courier.message.type = %message, messaging.message.id = id.as_deref().unwrap_or("-"),
                    elapsed_ms = elapsed.as_millis() as u64, "handled");
            }
        }
        WorkerEvent::Failed {
            transport,
            message,
            id,
            error,
            will_retry,
        } => {
            c.failed.fetch_add(1, Ordering::Relaxed);
            if let Some(t) = c.of(transport) {
                t.failed.fetch_add(1, Ordering::Relaxed);
            }
            if verbose {
                tracing::warn!(messaging.destination.name = %transport, courier.message.type = %message, messaging.message.id = id.as_deref().unwrap_or("-"),
                    will_retry, error = %crate::error::scrub(error), "failed");
            }
        }
        WorkerEvent::Retried {
            transport,
            id,
            retry_count,
            delay,
        } => {
            c.retried.fetch_add(1, Ordering::Relaxed);
            if verbose {
                tracing::info!(messaging.destination.name = %transport, messaging.message.id = id.as_deref().unwrap_or("-"), retry_count,
                    delay = %humantime::format_duration(*delay), "retried");
            }
        }
        WorkerEvent::MovedToFailureTransport {
            transport,
            failure_transport,
            id,
        } => {
            c.moved.fetch_add(1, Ordering::Relaxed);
            if verbose {
                tracing::info!(messaging.destination.name = %transport, courier.failure_transport = %failure_transport,
                    messaging.message.id = id.as_deref().unwrap_or("-"), "moved to the failure transport");
            }
        }
        WorkerEvent::TransportError { transport, error } => {
            tracing::warn!(messaging.destination.name = %transport, error = %crate::error::scrub(error), "transport error");
        }
        WorkerEvent::LeftForRedelivery {
            transport,
            id,
            reason,
        } => {
            tracing::warn!(messaging.destination.name = %transport, messaging.message.id = id.as_deref().unwrap_or("-"), reason = %reason, "left for redelivery");
        }
        _ => {}
    }
}

/// SIGINT and SIGTERM, as one stream.
pub(crate) struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = recv(&mut self.interrupt) => {}
                () = recv(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The first SIGINT/SIGTERM stops the worker gracefully (exit 0); a second one exits at once
/// with [`FORCED_EXIT`], after saying how many messages it leaves for redelivery.
async fn watch_signals(
    shutdown: CancellationToken,
    done: CancellationToken,
    grace: Duration,
    quiet: bool,
    counters: Arc<Counters>,
) {
    let mut signals = Signals::new();
    tokio::select! {
        () = signals.next() => {}
        () = done.cancelled() => return,
    }
    if !quiet {
        eprintln!(
            "\nStopping: finishing in-flight messages (up to {}); a second Ctrl-C exits at once.",
            humantime::format_duration(grace)
        );
    }
    shutdown.cancel();
    tokio::select! {
        () = signals.next() => {}
        () = done.cancelled() => return,
    }
    let left = counters.in_flight();
    tracing::warn!(
        in_flight = left,
        "second signal: exiting at once; in-flight messages are left for redelivery"
    );
    eprintln!(
        "Second signal: exiting at once; {left} in-flight message(s) left for redelivery \
         (delivered again after the transport's redelivery window)."
    );
    std::process::exit(i32::from(FORCED_EXIT));
}

/// The exit code of a `consume` stopped by a second signal (128 + SIGINT).
pub(crate) const FORCED_EXIT: u8 = 130;

/// `consume` was asked to stop while still waiting for its servers: exit 0, nothing consumed.
async fn stopped_before_start(
    ctx: &Ctx<'_>,
    helpers: &CancellationToken,
    tasks: Vec<Helper>,
) -> CliResult {
    helpers.cancel();
    join_helpers(tasks).await?;
    let mut stats = WorkerStats::default();
    stats.stop_reason = Some(StopReason::Shutdown);
    report(ctx, &stats)
}

async fn watch_stop_file(
    path: std::path::PathBuf,
    shutdown: CancellationToken,
    done: CancellationToken,
) {
    let started = stop::now_ms();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = done.cancelled() => return,
        }
        if stop::requested_at(&path).is_some_and(|at| at >= started) {
            tracing::info!(file = %path.display(), "stop requested by `courier stop-workers`");
            shutdown.cancel();
            return;
        }
    }
}

fn reason(r: Option<StopReason>) -> &'static str {
    match r {
        Some(StopReason::Shutdown) => "shutdown requested",
        Some(StopReason::MessageLimit) => "message limit reached",
        Some(StopReason::FailureLimit) => "failure limit reached",
        Some(StopReason::TimeLimit) => "time limit reached",
        Some(StopReason::MemoryLimit) => "memory limit reached",
        Some(StopReason::StopRequested) => "a listener or handler asked the worker to stop",
        _ => "stopped",
    }
}

fn report(ctx: &Ctx<'_>, s: &WorkerStats) -> CliResult {
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({
            "received": s.received,
            "handled": s.handled,
            "failed": s.failed,
            "retried": s.retried,
            "moved_to_failure": s.moved_to_failure,
            "left_for_redelivery": s.left_for_redelivery,
            "released": s.released,
            "stop_reason": reason(s.stop_reason),
        }));
    }
    ctx.note(format!(
        "Stopped: {}. {} received, {} handled, {} failed.",
        reason(s.stop_reason),
        s.received,
        s.handled,
        s.failed
    ));
    if s.failed > 0 || s.left_for_redelivery > 0 {
        ctx.note(format!(
            "{} retried, {} moved to the failure transport, {} left for redelivery.",
            s.retried, s.moved_to_failure, s.left_for_redelivery
        ));
    }
    if s.released > 0 {
        ctx.note(format!(
            "{} fetched but unstarted message(s) put back for other workers.",
            s.released
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_helper_task_that_panicked_fails_consume_with_its_name_and_message() {
        let tasks: Vec<Helper> = vec![
            ("progress", tokio::spawn(async {})),
            ("reaper", tokio::spawn(async { panic!("store exploded") })),
        ];
        let err = join_helpers(tasks).await.err();
        let err = err.expect("a panicked helper is an error");
        assert_eq!(err.exit_code(), 1);
        let text = err.to_string();
        assert!(
            text.contains("reaper") && text.contains("store exploded"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn helpers_that_ended_well_leave_consume_successful() {
        let tasks: Vec<Helper> = vec![("progress", tokio::spawn(async {}))];
        assert!(join_helpers(tasks).await.is_ok());
    }
}
