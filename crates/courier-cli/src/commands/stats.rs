//! `courier stats [TRANSPORT...] [--oldest]`: message counts per transport, and the age of
//! each queue's oldest message where the transport can tell (SQL; in JSON with `--oldest`):
//! for an outbox queue, its backlog is the count and the relay's lag is that age.
//!
//! A count includes every stored message, among them `RunAgent` messages whose run already
//! reached a terminal status (a run cancelled while queued, a duplicate re-dispatch): a worker
//! acks those without running anything. When runs are wired, `stats` looks at the oldest
//! [`SCAN_LIMIT`] messages of each listable transport and says on stderr how many are such
//! leftovers; the JSON on stdout keeps its shape (`{transport: count | null}`, or with
//! `--oldest` `{transport: {"messages": count | null, "oldest_s": seconds | null}}`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::context::Ctx;
use crate::error::CliResult;
use crate::table::Table;

/// How many stored messages per transport `stats` inspects for leftovers of settled runs.
#[cfg(feature = "runs")]
const SCAN_LIMIT: usize = 1_000;

/// One transport's line of `stats --oldest --format json`.
#[derive(serde::Serialize)]
struct Line {
    messages: Option<u64>,
    oldest_s: Option<f64>,
}

pub(crate) async fn run(
    ctx: &Ctx<'_>,
    names: &[String],
    oldest: bool,
    breakers: bool,
) -> CliResult {
    if breakers {
        return breakers_only(ctx).await;
    }
    ctx.check_transports(names)?;
    let transports = ctx.connect().await?;
    let counts = transports.message_counts(names).await?;
    let age = |name: &str| {
        let counter = transports.get(name).and_then(|t| t.as_message_count());
        async move {
            match counter {
                Some(counter) => counter.oldest_age().await,
                None => Ok(None),
            }
        }
    };
    if ctx.json() && oldest {
        let mut lines = BTreeMap::new();
        for (name, count) in &counts {
            let oldest_s = age(name).await?.map(|a| a.as_secs_f64());
            lines.insert(
                name.as_str(),
                Line {
                    messages: *count,
                    oldest_s,
                },
            );
        }
        ctx.print_json(&lines)?;
    } else if ctx.json() {
        ctx.print_json(&counts)?;
    } else {
        let mut table = Table::new(&["TRANSPORT", "MESSAGES", "OLDEST"]);
        for (name, count) in &counts {
            let age: Option<Duration> = age(name).await?;
            table.row(vec![
                name.clone(),
                count.map_or_else(|| "n/a".to_owned(), |c| c.to_string()),
                age.map_or_else(
                    || "-".to_owned(),
                    |a| humantime::format_duration(Duration::from_secs(a.as_secs())).to_string(),
                ),
            ]);
        }
        print!("{}", table.render());
        #[cfg(feature = "agent")]
        {
            let rows = crate::agents::breakers(ctx).await?;
            if !rows.is_empty() {
                print!("\n{}", breaker_table(&rows));
            }
        }
    }
    #[cfg(feature = "runs")]
    settled_leftovers(ctx, &transports, &counts).await;
    Ok(())
}

/// `stats --breakers`.
async fn breakers_only(ctx: &Ctx<'_>) -> CliResult {
    #[cfg(feature = "agent")]
    {
        if crate::agents::breaker_store(ctx)?.is_none() {
            return Err(crate::error::CliError::usage(
                "--breakers: no [agents.NAME] table of the configuration has a `breaker`",
            ));
        }
        let rows = crate::agents::breakers(ctx).await?;
        if ctx.json() {
            let rows: Vec<_> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "provider": r.provider,
                        "state": r.state.as_str(),
                        "failures": r.failures,
                        "opened_at": opened_at(r.opened_at),
                    })
                })
                .collect();
            ctx.print_json(&rows)?;
        } else {
            print!("{}", breaker_table(&rows));
        }
        Ok(())
    }
    #[cfg(not(feature = "agent"))]
    {
        let _ = ctx;
        Err(crate::error::CliError::usage(
            "--breakers needs the `agent` feature",
        ))
    }
}

/// When a breaker last opened (epoch ms, 0: never), RFC 3339.
#[cfg(feature = "agent")]
fn opened_at(ms: i64) -> Option<String> {
    let ms = u64::try_from(ms).ok().filter(|ms| *ms > 0)?;
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Some(humantime::format_rfc3339_millis(at).to_string())
}

#[cfg(feature = "agent")]
fn breaker_table(rows: &[courier_agent::breaker::BreakerRow]) -> String {
    let mut table = Table::new(&["BREAKER", "STATE", "FAILURES", "OPENED AT"]);
    for r in rows {
        table.row(vec![
            r.provider.clone(),
            r.state.as_str().to_owned(),
            r.failures.to_string(),
            opened_at(r.opened_at).unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    table.render()
}

/// Notes, per transport, the pending `RunAgent` messages whose run is already terminal.
/// Best effort: a store or transport that fails here only loses the note.
#[cfg(feature = "runs")]
async fn settled_leftovers(
    ctx: &Ctx<'_>,
    transports: &courier_core::config::Transports,
    counts: &BTreeMap<String, Option<u64>>,
) {
    use courier_runs::RunAgent;

    if !crate::runs::enabled(ctx) || ctx.quiet {
        return;
    }
    let Ok(config) = crate::runs::settings(ctx) else {
        return;
    };
    let store = match crate::runs::open_store(&config).await {
        Ok(store) => store,
        Err(e) => {
            tracing::debug!(error = %e, "stats: no run store to check leftovers against");
            return;
        }
    };
    for (name, count) in counts {
        let (Some(count), Some(transport)) = (count, transports.get(name)) else {
            continue;
        };
        let Some(listable) = transport.as_listable().filter(|_| *count > 0) else {
            continue;
        };
        let Ok(messages) = listable.list(SCAN_LIMIT).await else {
            continue;
        };
        let mut settled = 0_u64;
        for envelope in &messages {
            let Some(message) = envelope.message::<RunAgent>() else {
                continue;
            };
            if let Ok(Some(run)) = store.find(message.run_id).await
                && run.status.is_terminal()
            {
                settled += 1;
            }
        }
        if settled > 0 {
            let scope = if messages.len() < SCAN_LIMIT {
                String::new()
            } else {
                format!(" (of the oldest {SCAN_LIMIT})")
            };
            ctx.note(format!(
                "note: {settled} message(s){scope} counted in `{name}` are RunAgent messages of runs \
                 already settled; a worker acks them without running anything."
            ));
        }
    }
}
