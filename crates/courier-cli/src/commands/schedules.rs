//! `courier schedules`: the configured schedules with their next fire time, last fired tick
//! and lease holder (from the schedule store). `courier pause` / `courier resume` sit here too
//! (a flag in the transport's server, beside the schedule store).
//!
//! JSON (`--format json`): an array, by name, of `{"name", "message", "agent", "trigger", "missed",
//! "next_fire", "next_fire_ms", "last_fired", "last_fired_ms", "owner", "store"}` (times RFC
//! 3339 plus the raw epoch ms; `null` when unknown).

use courier_core::{Missed, rfc3339_ms, schedule::now_ms};

use crate::context::Ctx;
use crate::error::CliResult;
use crate::table::Table;

pub(crate) async fn run(ctx: &Ctx<'_>) -> CliResult {
    let transports = ctx.connect().await?;
    let Some(scheduler) =
        crate::schedules::scheduler(ctx, &transports, "courier-schedules", None, None)?
    else {
        if ctx.json() {
            return ctx.print_json(&Vec::<serde_json::Value>::new());
        }
        println!("No schedule is configured ([schedules.NAME] in the configuration).");
        return Ok(());
    };
    let store = crate::schedules::store(&transports).map(|(_, what)| what);
    let now = now_ms();
    let rows = scheduler.describe(now).await?;
    let config = transports.config();
    let time = |ms: Option<i64>| ms.map(rfc3339_ms);
    if ctx.json() {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(s, next, state)| {
                let last = state.as_ref().and_then(|st| st.last_tick_ms);
                serde_json::json!({
                    "name": s.name(),
                    "message": config.schedules.get(s.name()).and_then(|c| c.message.clone()),
                    "agent": config.schedules.get(s.name()).and_then(|c| c.agent.clone()),
                    "trigger": s.trigger().describe(),
                    "missed": missed(s.missed_policy()),
                    "next_fire": time(*next),
                    "next_fire_ms": next,
                    "last_fired": time(last),
                    "last_fired_ms": last,
                    "owner": state.as_ref().and_then(|st| st.owner.clone()),
                    "store": store,
                })
            })
            .collect();
        return ctx.print_json(&list);
    }
    let mut table = Table::new(&[
        "NAME",
        "TRIGGER",
        "MISSED",
        "NEXT FIRE",
        "LAST FIRED",
        "OWNER",
    ])
    .flexible(1)
    .flexible(5);
    for (s, next, state) in &rows {
        let last = state.as_ref().and_then(|st| st.last_tick_ms);
        table.row(vec![
            s.name().to_owned(),
            s.trigger().describe(),
            missed(s.missed_policy()),
            time(*next).unwrap_or_else(|| "-".into()),
            time(last).unwrap_or_else(|| "-".into()),
            state
                .as_ref()
                .and_then(|st| st.owner.clone())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    print!("{}", table.render());
    if let Some(store) = store {
        ctx.note(format!("{} schedule(s), stored in {store}.", rows.len()));
    }
    Ok(())
}

/// `courier pause T` / `courier resume T`: sets or clears the transport's pause flag.
pub(crate) async fn pause(ctx: &Ctx<'_>, name: &str, paused: bool) -> CliResult {
    ctx.check_transports(std::slice::from_ref(&name.to_owned()))?;
    let transports = ctx.connect().await?;
    let Some(pausable) = transports.get(name).and_then(|t| t.as_pausable()) else {
        return Err(crate::error::CliError::usage(format!(
            "transport `{name}` cannot be paused (SQL and Redis transports can)"
        )));
    };
    let changed = pausable.set_paused(paused).await?;
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({
            "transport": name, "paused": paused, "changed": changed,
        }));
    }
    let state = if paused { "paused" } else { "resumed" };
    if changed {
        println!("Transport `{name}` {state}.");
    } else {
        println!(
            "Transport `{name}` was already {}.",
            if paused { "paused" } else { "running" }
        );
    }
    Ok(())
}

fn missed(m: Missed) -> String {
    match m {
        Missed::CatchUp(n) => format!("catch_up ({n})"),
        _ => "skip".to_owned(),
    }
}
