//! `courier workers`: the running workers of this configuration, from its worker registries
//! (every distinct SQL table or Redis hash its transports offer, else the run store's).
//!
//! JSON (`--format json`): an array, oldest first, of `{"id", "host", "pid", "version",
//! "transports", "started_at", "started_at_ms", "last_heartbeat", "last_heartbeat_ms",
//! "handled", "failed", "stop_requested"}` (times RFC 3339, plus the raw epoch ms).

use courier_core::WorkerRecord;

use crate::context::Ctx;
use crate::error::CliResult;
use crate::registry;
use crate::table::Table;
use courier_core::rfc3339_ms;

pub(crate) async fn run(ctx: &Ctx<'_>) -> CliResult {
    let transports = ctx.connect().await?;
    let found = registry::all(ctx, &transports).await;
    let mut workers: Vec<WorkerRecord> = Vec::new();
    for f in &found {
        for w in f.registry.list().await? {
            if !workers.iter().any(|seen| seen.id == w.id) {
                workers.push(w);
            }
        }
    }
    workers.sort_by(|a, b| a.started_at_ms.cmp(&b.started_at_ms).then(a.id.cmp(&b.id)));
    if ctx.json() {
        let list: Vec<serde_json::Value> = workers.iter().map(json).collect();
        return ctx.print_json(&list);
    }
    if found.is_empty() {
        ctx.note(
            "No worker registry: no transport of this configuration keeps one (SQL, Redis) and \
             the run store is not SQL.",
        );
        return Ok(());
    }
    if workers.is_empty() {
        println!("No worker is running (none registered with a fresh heartbeat).");
        return Ok(());
    }
    let mut table = Table::new(&[
        "ID",
        "HOST",
        "PID",
        "VERSION",
        "TRANSPORTS",
        "STARTED",
        "HEARTBEAT",
        "HANDLED",
        "FAILED",
    ])
    .flexible(0)
    .flexible(4)
    .flexible(1);
    for w in &workers {
        let mut id = w.id.clone();
        if w.stop_requested {
            id.push_str(" (stopping)");
        }
        table.row(vec![
            id,
            w.host.clone(),
            w.pid.to_string(),
            w.version.clone(),
            w.transports.join(","),
            short_time(w.started_at_ms),
            short_time(w.last_heartbeat_ms),
            w.handled.to_string(),
            w.failed.to_string(),
        ]);
    }
    print!("{}", table.render());
    ctx.note(format!("{} worker(s).", workers.len()));
    Ok(())
}

fn json(w: &WorkerRecord) -> serde_json::Value {
    serde_json::json!({
        "id": w.id,
        "host": w.host,
        "pid": w.pid,
        "version": w.version,
        "transports": w.transports,
        "started_at": rfc3339_ms(w.started_at_ms),
        "started_at_ms": w.started_at_ms,
        "last_heartbeat": rfc3339_ms(w.last_heartbeat_ms),
        "last_heartbeat_ms": w.last_heartbeat_ms,
        "handled": w.handled,
        "failed": w.failed,
        "stop_requested": w.stop_requested,
    })
}

/// `2026-11-30 01:02:03` (UTC, to the second), for the table.
fn short_time(ms: i64) -> String {
    let t = rfc3339_ms(ms);
    t.get(..19).map_or(t.clone(), |s| s.replace('T', " "))
}
