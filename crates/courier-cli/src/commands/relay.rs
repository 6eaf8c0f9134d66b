//! `courier relay --from OUTBOX --to DESTINATION`: forward an outbox queue to another transport
//! (see [`courier_core::relay`]) until SIGINT/SIGTERM (the batches in flight finish first) or
//! `--limit` messages are forwarded.

use std::sync::Arc;

use courier_core::CancellationToken;
use courier_core::relay::{Relay, RelayOptions};

use crate::cli::RelayArgs;
use crate::commands::consume::Signals;
use crate::connect;
use crate::context::Ctx;
use crate::error::{CliError, CliResult};

pub(crate) async fn run(ctx: &Ctx<'_>, args: &RelayArgs) -> CliResult {
    let names = [args.from.clone(), args.to.clone()];
    ctx.check_transports(&names)?;
    if args.from == args.to {
        return Err(CliError::usage(
            "`--from` and `--to` name the same transport",
        ));
    }
    let mut options = RelayOptions::default()
        .batch_size(usize::from(args.batch_size))
        .limit(args.limit)
        .hold_limit(args.hold_limit);
    for hook in &ctx.app.relay_hooks {
        options = hook(options);
    }
    let shutdown = CancellationToken::new();
    let watcher = tokio::spawn(stop_on_signal(shutdown.clone(), ctx.quiet));
    let transports = match connect::until_up(&shutdown, || ctx.try_connect()).await? {
        Some(transports) => transports,
        None => return Ok(()),
    };
    let endpoint = |name: &str| -> CliResult<Arc<dyn courier_core::Transport>> {
        transports
            .get(name)
            .cloned()
            .ok_or_else(|| CliError::usage(format!("unknown transport `{name}`")))
    };
    let relay = Relay::new(
        &args.from,
        endpoint(&args.from)?,
        &args.to,
        endpoint(&args.to)?,
    )
    .options(options);
    ctx.note(format!(
        "Relaying `{}` to `{}`; stop with Ctrl-C.",
        args.from, args.to
    ));
    let result = relay.run(shutdown).await;
    watcher.abort();
    let stats = result.map_err(|e| CliError::runtime(crate::error::chain(&e)))?;
    if ctx.json() {
        ctx.print_json(&serde_json::json!({
            "from": args.from, "to": args.to,
            "relayed": stats.relayed, "batches": stats.batches,
        }))?;
    } else {
        ctx.note(format!(
            "Relayed {} message(s) in {} batch(es).",
            stats.relayed, stats.batches
        ));
    }
    Ok(())
}

async fn stop_on_signal(shutdown: CancellationToken, quiet: bool) {
    let mut signals = Signals::new();
    signals.next().await;
    if !quiet {
        eprintln!("\nStopping after the batch in flight.");
    }
    shutdown.cancel();
}
