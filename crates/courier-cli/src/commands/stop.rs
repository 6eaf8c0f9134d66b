//! `courier stop-workers`: ask every worker of this configuration to stop gracefully.
//!
//! Writes the current time (epoch ms) to the stop file next to the configuration
//! (`courier.toml.stop-workers`, or `./courier.stop-workers` for the embedded configuration).
//! Every `consume` of the same configuration checks that file once a second and stops like on
//! SIGTERM when it holds a time later than its own start. Workers must share the file system.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::context::Ctx;
use crate::error::{CliError, CliResult};

pub(crate) fn run(ctx: &Ctx<'_>) -> CliResult {
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
    println!("Asked the workers to stop (wrote {}).", path.display());
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
