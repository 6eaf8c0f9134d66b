//! `courier failed show | retry | remove`: the messages in failure transports.

use courier_core::config::Transports;
use courier_core::failed::{FailedMessage as Row, RetryFailedError, retry_failed};
use courier_core::{Envelope, ErrorDetailsStamp, Listable};

use crate::cli::{FailedCommand, FailedIds};
use crate::context::Ctx;
use crate::error::{CliError, CliResult};
use crate::table::{Table, shorten};

pub(crate) async fn run(ctx: &Ctx<'_>, command: &FailedCommand) -> CliResult {
    match command {
        FailedCommand::Show { id, transport, max } => {
            show(ctx, id.as_deref(), transport.as_deref(), *max).await
        }
        FailedCommand::Retry(ids) => act(ctx, ids, true).await,
        FailedCommand::Remove(ids) => act(ctx, ids, false).await,
    }
}

/// The failure transports to look at: the one named, else every configured one.
fn failure_names(ctx: &Ctx<'_>, named: Option<&str>) -> CliResult<Vec<String>> {
    if let Some(name) = named {
        ctx.check_transports(&[name.to_owned()])?;
        return Ok(vec![name.to_owned()]);
    }
    let names = ctx.config.failure_transport_names();
    if names.is_empty() {
        return Err(CliError::usage(
            "no failure transport is configured (set `failure_transport` on a transport)",
        ));
    }
    Ok(names)
}

fn listable<'t>(transports: &'t Transports, name: &str) -> CliResult<&'t dyn Listable> {
    let t = transports
        .get(name)
        .ok_or_else(|| CliError::usage(format!("unknown transport `{name}`")))?;
    t.as_listable().ok_or_else(|| {
        CliError::usage(format!(
            "transport `{name}` cannot list its messages (its transport does not support browsing, e.g. AMQP); \
             use a SQL or Redis transport as the failure transport to inspect, retry or remove failed messages"
        ))
    })
}

async fn show(ctx: &Ctx<'_>, id: Option<&str>, transport: Option<&str>, max: usize) -> CliResult {
    let names = failure_names(ctx, transport)?;
    let transports = ctx.connect().await?;
    let mut rows = Vec::new();
    let mut details = Vec::new();
    for name in &names {
        let list = listable(&transports, name)?;
        match id {
            Some(id) => {
                if let Some(e) = list.find(id).await? {
                    rows.push(Row::new(name, &e));
                    details.push(e);
                }
            }
            None => {
                for e in list.list(max.saturating_sub(rows.len())).await? {
                    rows.push(Row::new(name, &e));
                }
            }
        }
    }
    if let (Some(id), true) = (id, rows.is_empty()) {
        return Err(CliError::runtime(format!(
            "no failed message with id `{id}` in {}",
            names.join(", ")
        )));
    }
    if ctx.json() {
        return ctx.print_json(&rows);
    }
    if let (Some(row), Some(e)) = (rows.first(), details.first()) {
        print_one(row, e);
        return Ok(());
    }
    if rows.is_empty() {
        println!("No failed messages in {}.", names.join(", "));
        return Ok(());
    }
    let mut table = Table::new(&["ID", "TYPE", "FROM", "RETRIES", "ERROR"]).flexible(4);
    for r in &rows {
        table.row(vec![
            shorten(r.id.as_deref().unwrap_or("-"), 20),
            shorten(&r.kind, 24),
            r.transport.clone().unwrap_or_else(|| "-".into()),
            r.retry_count.to_string(),
            match (&r.error_class, &r.error) {
                (Some(c), Some(m)) => format!("{c}: {m}"),
                _ => "-".into(),
            },
        ]);
    }
    print!("{}", table.render());
    println!(
        "{} failed message(s); details: `courier failed show ID`.",
        rows.len()
    );
    Ok(())
}

fn print_one(row: &Row, e: &Envelope) {
    let field = |k: &str, v: &str| {
        for (i, line) in wrap(v, crate::table::WIDTH - 15).iter().enumerate() {
            println!("{:<14} {line}", if i == 0 { k } else { "" });
        }
    };
    field("id", row.id.as_deref().unwrap_or("-"));
    field("type", &row.kind);
    field("from", row.transport.as_deref().unwrap_or("-"));
    field("stored in", &row.failure_transport);
    field("retries", &row.retry_count.to_string());
    field("failed at", row.failed_at.as_deref().unwrap_or("-"));
    if let Some(d) = e.last::<ErrorDetailsStamp>() {
        field("error class", &d.class);
        field("error", &d.message);
        for cause in &d.chain {
            field("caused by", cause);
        }
    }
    let stamps: Vec<&str> = e.stamp_names().collect();
    field("stamps", &stamps.join(", "));
}

async fn act(ctx: &Ctx<'_>, ids: &FailedIds, retry: bool) -> CliResult {
    let names = failure_names(ctx, ids.transport.as_deref())?;
    let transports = ctx.connect().await?;
    let mut done = Vec::new();
    let mut missing: Vec<String> = ids.ids.clone();
    for name in &names {
        let list = listable(&transports, name)?;
        let envelopes: Vec<Envelope> = if ids.all {
            list.list(usize::MAX).await?
        } else {
            let mut found = Vec::new();
            for id in &ids.ids {
                if let Some(e) = list.find(id).await? {
                    missing.retain(|m| m != id);
                    found.push(e);
                }
            }
            found
        };
        for e in envelopes {
            let id = if retry {
                retry_failed(&transports, list, e)
                    .await
                    .map_err(|e| match e {
                        RetryFailedError::UnknownTransport { .. } => CliError::usage(e.to_string()),
                        RetryFailedError::Transport(t) => t.into(),
                        other => CliError::runtime(other.to_string()),
                    })?
            } else {
                let id = e.id().unwrap_or_default().to_owned();
                list.remove(&id).await?;
                id
            };
            done.push(id);
        }
    }
    if !missing.is_empty() && !ids.all {
        if ctx.json() {
            ctx.print_json(&serde_json::json!({ "done": done, "missing": missing }))?;
        }
        return Err(CliError::runtime(format!(
            "no failed message with id {}",
            missing.join(", ")
        )));
    }
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({ "done": done, "missing": missing }));
    }
    let verb = if retry { "Retried" } else { "Removed" };
    println!("{verb} {} failed message(s).", done.len());
    Ok(())
}

/// Splits `text` into lines of at most `width` characters, at spaces where possible.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut pieces = Vec::new();
    for word in text.split(' ') {
        let chars: Vec<char> = word.chars().collect();
        if chars.is_empty() {
            pieces.push(String::new());
        }
        pieces.extend(chars.chunks(width).map(|c| c.iter().collect::<String>()));
    }
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for piece in pieces {
        let len = line.chars().count();
        if len > 0 && len + 1 + piece.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&piece);
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    #[test]
    fn wrap_keeps_lines_within_the_width() {
        let lines = super::wrap(
            "unknown message type `app.unknown` (no message registered)",
            20,
        );
        assert!(lines.iter().all(|l| l.chars().count() <= 20), "{lines:?}");
        assert_eq!(
            lines.join(" "),
            "unknown message type `app.unknown` (no message registered)"
        );
        assert_eq!(super::wrap(&"x".repeat(45), 20).len(), 3);
    }
}
