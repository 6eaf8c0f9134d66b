//! `courier failed show | retry | remove`: the messages in failure transports, as Messenger's
//! `messenger:failed:*` commands: on a terminal, `retry` and `remove` show each message and ask
//! what to do with it unless `--force`.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};

use courier_core::config::Transports;
use courier_core::failed::{FailedMessage as Row, RetryFailedError, retry_failed_to};
use courier_core::{Envelope, ErrorDetailsStamp, Listable};

use crate::cli::{FailedCommand, FailedIds};
use crate::context::Ctx;
use crate::error::{CliError, CliResult};
use crate::table::{Table, shorten};

pub(crate) async fn run(ctx: &Ctx<'_>, command: &FailedCommand) -> CliResult {
    match command {
        FailedCommand::Show {
            id,
            transport,
            max,
            class_filter,
            stats,
        } => {
            let filter = class_filter.as_deref();
            if *stats {
                return show_stats(ctx, transport.as_deref(), filter).await;
            }
            show(ctx, id.as_deref(), transport.as_deref(), *max, filter).await
        }
        FailedCommand::Retry(retry) => {
            if let Some(to) = &retry.to {
                ctx.check_transports(std::slice::from_ref(to))?;
            }
            act(ctx, &retry.ids, Some(retry.to.as_deref())).await
        }
        FailedCommand::Remove(ids) => act(ctx, ids, None).await,
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

/// Whether `e` passes `--class-filter`.
fn of_type(e: &Envelope, filter: Option<&str>) -> bool {
    filter.is_none_or(|t| e.message_name() == t)
}

/// `failed show --stats`: counts by message type and by error class.
async fn show_stats(ctx: &Ctx<'_>, transport: Option<&str>, filter: Option<&str>) -> CliResult {
    let names = failure_names(ctx, transport)?;
    let transports = ctx.connect().await?;
    let mut by_type: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_class: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0u64;
    for name in &names {
        for e in listable(&transports, name)?.list(usize::MAX).await? {
            if !of_type(&e, filter) {
                continue;
            }
            total += 1;
            *by_type.entry(e.message_name().to_owned()).or_default() += 1;
            let class = e
                .last::<ErrorDetailsStamp>()
                .map_or_else(|| "-".to_owned(), |d| d.class.clone());
            *by_class.entry(class).or_default() += 1;
        }
    }
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({
            "total": total,
            "by_type": by_type,
            "by_error_class": by_class,
        }));
    }
    if total == 0 {
        println!("No failed messages in {}.", names.join(", "));
        return Ok(());
    }
    for (title, counts) in [("TYPE", &by_type), ("ERROR CLASS", &by_class)] {
        let mut table = Table::new(&[title, "COUNT"]).flexible(0);
        for (key, n) in counts {
            table.row(vec![key.clone(), n.to_string()]);
        }
        print!("{}", table.render());
        println!();
    }
    println!("{total} failed message(s) in {}.", names.join(", "));
    Ok(())
}

async fn show(
    ctx: &Ctx<'_>,
    id: Option<&str>,
    transport: Option<&str>,
    max: usize,
    filter: Option<&str>,
) -> CliResult {
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
                let listed = if filter.is_some() {
                    list.list(usize::MAX).await?
                } else {
                    list.list(max.saturating_sub(rows.len())).await?
                };
                for e in listed.iter().filter(|e| of_type(e, filter)) {
                    if rows.len() >= max {
                        break;
                    }
                    rows.push(Row::new(name, e));
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
    println!("{:<14} {}", "body", body(e));
}

/// The message body as stored (JSON), or why it cannot be shown.
fn body(e: &Envelope) -> String {
    match courier_core::encode_json(e) {
        Ok(encoded) => encoded.body,
        Err(err) => format!("(cannot be shown: {err})"),
    }
}

/// What the operator chose for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Retry,
    Delete,
    Skip,
    Quit,
}

/// Asks on the terminal until the answer is one of the offered letters.
fn ask(question: &str, offered: &[(char, Choice)]) -> CliResult<Choice> {
    let letters: String = offered.iter().map(|(c, _)| *c).collect();
    let stdin = std::io::stdin();
    loop {
        print!("{question} [{letters}] ");
        std::io::stdout()
            .flush()
            .map_err(|e| CliError::runtime(format!("cannot write the question: {e}")))?;
        let mut line = String::new();
        let read = stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| CliError::runtime(format!("cannot read the answer: {e}")))?;
        if read == 0 {
            return Ok(Choice::Quit);
        }
        let answer = line.trim().to_lowercase();
        if let Some((_, choice)) = offered.iter().find(|(c, _)| answer.starts_with(*c)) {
            return Ok(*choice);
        }
        println!("Answer one of: {letters}.");
    }
}

/// `retry` (`Some(target)`, `None` inside: the transport each failed on) or `remove` (`None`).
async fn act(ctx: &Ctx<'_>, ids: &FailedIds, retry: Option<Option<&str>>) -> CliResult {
    let names = failure_names(ctx, ids.transport.as_deref())?;
    let transports = ctx.connect().await?;
    let interactive = !ids.force
        && !ctx.json()
        && std::io::stdin().is_terminal()
        && std::io::stdout().is_terminal();
    let mut done = Vec::new();
    let mut removed = Vec::new();
    let mut skipped = 0usize;
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
        for e in envelopes
            .into_iter()
            .filter(|e| of_type(e, ids.class_filter.as_deref()))
        {
            let mut choice = if retry.is_some() {
                Choice::Retry
            } else {
                Choice::Delete
            };
            if interactive {
                print_one(&Row::new(name, &e), &e);
                choice = if retry.is_some() {
                    ask(
                        "Retry (r), delete (d), skip (s) or quit (q)?",
                        &[
                            ('r', Choice::Retry),
                            ('d', Choice::Delete),
                            ('s', Choice::Skip),
                            ('q', Choice::Quit),
                        ],
                    )?
                } else {
                    ask(
                        "Remove it for good (y), skip (n) or quit (q)?",
                        &[
                            ('y', Choice::Delete),
                            ('n', Choice::Skip),
                            ('q', Choice::Quit),
                        ],
                    )?
                };
                println!();
            }
            match choice {
                Choice::Retry => {
                    let to = retry.flatten();
                    let id =
                        retry_failed_to(&transports, list, e, to)
                            .await
                            .map_err(|e| match e {
                                RetryFailedError::UnknownTransport { .. } => {
                                    CliError::usage(e.to_string())
                                }
                                RetryFailedError::Transport(t) => t.into(),
                                other => CliError::runtime(other.to_string()),
                            })?;
                    done.push(id);
                }
                Choice::Delete => {
                    let id = e.id().unwrap_or_default().to_owned();
                    list.remove(&id).await?;
                    if retry.is_some() {
                        removed.push(id);
                    } else {
                        done.push(id);
                    }
                }
                Choice::Skip => skipped += 1,
                Choice::Quit => return summary(ctx, retry.is_some(), &done, &removed, skipped),
            }
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
    summary(ctx, retry.is_some(), &done, &removed, skipped)
}

/// `Retried N failed message(s).`, plus what was deleted or skipped on the way.
fn summary(
    ctx: &Ctx<'_>,
    retry: bool,
    done: &[String],
    removed: &[String],
    skipped: usize,
) -> CliResult {
    if ctx.json() {
        return ctx.print_json(
            &serde_json::json!({ "done": done, "removed": removed, "skipped": skipped }),
        );
    }
    let verb = if retry { "Retried" } else { "Removed" };
    let mut line = format!("{verb} {} failed message(s)", done.len());
    if !removed.is_empty() {
        line.push_str(&format!(", removed {}", removed.len()));
    }
    if skipped > 0 {
        line.push_str(&format!(", skipped {skipped}"));
    }
    println!("{line}.");
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
