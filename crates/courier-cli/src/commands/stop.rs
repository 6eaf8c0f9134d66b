//! `courier stop-workers`: ask every worker of this configuration to stop gracefully.
//!
//! Through the worker registries (every distinct SQL table or Redis hash the configuration's
//! transports offer, else the run store's): each live worker sees the request at its next
//! heartbeat (every 2 s) and stops like on SIGTERM, on whatever host it runs. Only when the
//! configuration has no shared store (e.g. in-memory or sync transports only) does it fall back
//! to the stop file next to the configuration (`courier.toml.stop-workers`, or
//! `./courier.stop-workers` for the embedded configuration), which `consume` checks twice a
//! second; that reaches only workers sharing the file system.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::context::Ctx;
use crate::error::{CliError, CliResult};
use crate::registry;

pub(crate) async fn run(ctx: &Ctx<'_>) -> CliResult {
    let transports = ctx.connect().await?;
    let found = registry::all(ctx, &transports).await;
    if found.is_empty() {
        return write_stop_file(ctx);
    }
    let mut requested = 0;
    for f in &found {
        requested += f.registry.request_stop(None).await?;
    }
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({ "requested": requested }));
    }
    println!("Asked {requested} worker(s) to stop; each finishes its in-flight messages first.");
    Ok(())
}

fn write_stop_file(ctx: &Ctx<'_>) -> CliResult {
    let path = ctx.stop_file();
    let now = now_ms();
    std::fs::write(&path, now.to_string()).map_err(|e| {
        CliError::runtime(format!(
            "cannot write the stop file `{}`: {e}",
            path.display()
        ))
    })?;
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({ "stop_file": path, "requested_at_ms": now }));
    }
    println!(
        "No shared worker registry in this configuration: wrote the stop file {} (reaches \
         workers on this file system only).",
        path.display()
    );
    Ok(())
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The stop time in the file, if any.
pub(crate) fn requested_at(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}
