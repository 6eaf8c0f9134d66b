//! What a scenario checks once the chaos is over: every message handled once, every run
//! finished, the poison in the failure transport, nothing left behind, and what the workers
//! logged.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use courier_runs::RunStore;
use sqlx::Connection as _;
use sqlx::SqlitePool;
use uuid::Uuid;

use super::Plan;
use crate::poison::{self, Poison, Storage};
use crate::report::Report;

pub(super) async fn check_messages(
    report: &mut Report,
    sink: &SqlitePool,
    plan: &Plan,
    resent: &Mutex<HashSet<u64>>,
    backs: &[i64],
) -> anyhow::Result<()> {
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT id, COUNT(*) FROM chaos_log GROUP BY id")
        .fetch_all(sink)
        .await?;
    let counts: HashMap<u64, i64> = rows
        .into_iter()
        .filter_map(|(id, n)| u64::try_from(id).ok().map(|id| (id, n)))
        .collect();
    let resent = resent.lock().map(|r| r.clone()).unwrap_or_default();
    report.resent = resent.len() as u64;
    report.lost = (0..plan.messages)
        .filter(|id| !counts.contains_key(id))
        .collect();
    report.handled_twice = counts
        .iter()
        .filter(|(id, n)| **n > 1 && !resent.contains(id))
        .count() as u64;
    let server_kills = u64::from(report.server_restarts.unwrap_or(0));
    report.twice_bound =
        plan.fetch_size * (u64::from(report.worker_kills) + plan.workers as u64 * server_kills);
    if !report.lost.is_empty() {
        let shown: Vec<String> = report.lost.iter().take(40).map(u64::to_string).collect();
        report.failures.push(format!(
            "{} message(s) never handled (lost or stuck), ids: {}{}",
            report.lost.len(),
            shown.join(" "),
            if report.lost.len() > 40 { " ..." } else { "" }
        ));
    }
    let strangers = counts.keys().filter(|id| **id >= plan.messages).count();
    if strangers > 0 {
        report
            .failures
            .push(format!("{strangers} handled id(s) were never produced"));
    }
    if report.handled_twice > report.twice_bound {
        report.failures.push(format!(
            "{} id(s) handled more than once, more than the bound fetch_size {} x (worker kills {} + workers {} x server kills {}) = {}",
            report.handled_twice, plan.fetch_size, report.worker_kills, plan.workers, server_kills, report.twice_bound
        ));
    }
    for (i, back) in backs.iter().enumerate() {
        let first: Option<i64> =
            sqlx::query_scalar("SELECT MIN(at_ms) FROM chaos_log WHERE at_ms >= ?")
                .bind(back)
                .fetch_one(sink)
                .await?;
        match first {
            Some(at) => report.recover_ms.push(at - back),
            None => report.failures.push(format!(
                "nothing was handled after server restart {}",
                i + 1
            )),
        }
    }
    Ok(())
}

pub(super) async fn check_runs(
    report: &mut Report,
    store: &dyn RunStore,
    ids: &[Uuid],
) -> anyhow::Result<()> {
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut stuck = Vec::new();
    for &id in ids {
        let Some(run) = store.find(id).await? else {
            report
                .failures
                .push(format!("run {id} is missing from the store"));
            continue;
        };
        let label = match run.termination_reason {
            Some(reason) if run.status.as_str() != "completed" => {
                format!("{}:{}", run.status.as_str(), reason.as_str())
            }
            _ => run.status.as_str().to_owned(),
        };
        *statuses.entry(label).or_default() += 1;
        if !run.status.is_terminal() {
            stuck.push(format!(
                "{id} {} (requeues {}, claimed_by {}, lease_expires {})",
                run.status.as_str(),
                run.requeue_count,
                run.claimed_by.as_deref().unwrap_or("-"),
                run.lease_expires
            ));
        }
        let events = store.events(id).await?;
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        let want: Vec<i64> = (1..=i64::try_from(seqs.len()).unwrap_or(0)).collect();
        if seqs != want {
            report.failures.push(format!(
                "run {id}: event seqs not contiguous from 1: {seqs:?}"
            ));
        }
        // Owners: each execution's steps form one block in seq order and in time.
        let mut blocks: Vec<(String, i64, i64)> = Vec::new();
        for e in events.iter().filter(|e| e.kind == "chaos") {
            let owner = e
                .payload
                .get("owner")
                .and_then(|o| o.as_str())
                .unwrap_or("?")
                .to_owned();
            match blocks.last_mut() {
                Some((o, _, end)) if *o == owner => *end = e.created_at,
                _ => blocks.push((owner, e.created_at, e.created_at)),
            }
        }
        let mut seen = HashSet::new();
        for (i, (owner, start, _)) in blocks.iter().enumerate() {
            if !seen.insert(owner.clone()) {
                report.failures.push(format!("run {id}: owner {owner} wrote steps again after another owner took over (two owners at once)"));
            }
            if i > 0 && blocks[i - 1].2 > *start {
                report.failures.push(format!(
                    "run {id}: owner {} wrote until {} but owner {owner} started at {start} (two owners at once)",
                    blocks[i - 1].0,
                    blocks[i - 1].2
                ));
            }
        }
    }
    for (label, n) in &statuses {
        if label != "completed" && !label.starts_with("queued") && !label.starts_with("running") {
            report.notes.push(format!(
                "{n} run(s) ended `{label}` although every agent step succeeds (an outage or a kill dead-lettered them)"
            ));
        }
    }
    report.run_statuses = statuses.into_iter().collect();
    if !stuck.is_empty() {
        report.failures.push(format!(
            "{} run(s) not terminal: {}",
            stuck.len(),
            stuck.join("; ")
        ));
    }
    match report.runs_terminal_ms {
        Some(ms) if ms > report.runs_bound_ms => report.failures.push(format!(
            "runs became terminal {ms} ms after the last kill or server restart, past the bound of {} ms (lease + reap interval + redeliver window)",
            report.runs_bound_ms
        )),
        _ => {}
    }
    Ok(())
}

pub(super) async fn check_failed(report: &mut Report, storage: &Storage, poison: &[Poison]) {
    let rows = match poison::failed_rows(storage).await {
        Ok(rows) => rows,
        Err(e) => {
            report
                .failures
                .push(format!("cannot read the failure transport: {e:#}"));
            return;
        }
    };
    let mut found: HashMap<&str, usize> = HashMap::new();
    for row in &rows {
        match row.poison(poison) {
            Some(p) => *found.entry(p.kind).or_default() += 1,
            None => report.failures.push(format!(
                "failure transport holds a message that is not poison: {}",
                row.describe()
            )),
        }
    }
    for p in poison {
        match found.get(p.kind).copied().unwrap_or(0) {
            1 => {}
            0 => report.failures.push(format!(
                "poison `{}` is not in the failure transport",
                p.kind
            )),
            n => report.failures.push(format!(
                "poison `{}` is in the failure transport {n} times",
                p.kind
            )),
        }
    }
}

/// Notes what is still stored in the consumed queue (SQL rows, Redis entries).
pub(super) async fn leftovers(report: &mut Report, storage: &Storage) {
    let count = match storage {
        Storage::Sql { url } => match sqlx::AnyConnection::connect(url).await {
            Ok(mut c) => sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM courier_messages WHERE queue_name = 'default'",
            )
            .fetch_one(&mut c)
            .await
            .ok(),
            Err(_) => None,
        },
        Storage::Redis { url, stream } => match redis::Client::open(url.as_str()) {
            Ok(client) => match client.get_multiplexed_async_connection().await {
                Ok(mut c) => redis::cmd("XLEN")
                    .arg(stream)
                    .query_async::<i64>(&mut c)
                    .await
                    .ok(),
                Err(_) => None,
            },
            Err(_) => None,
        },
        Storage::Nats { url, .. } => poison::nats_stored(url, "chaos").await.ok(),
        Storage::Amqp { .. } => None,
    };
    if let Some(n) = count.filter(|n| *n > 0) {
        report.notes.push(format!(
            "{n} message(s) still stored in the consumed queue at the end"
        ));
    }
}

/// Notes the most frequent warnings and errors the workers logged (timestamps stripped).
pub(super) fn worker_warnings(report: &mut Report, dir: &Path) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("worker-") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            if line.contains("WARN") || line.contains("ERROR") || line.starts_with("Error") {
                let key = line.split_once(' ').map_or(line, |(_, rest)| rest).trim();
                *counts.entry(key.chars().take(200).collect()).or_default() += 1;
            }
        }
    }
    let mut top: Vec<(String, usize)> = counts.into_iter().collect();
    top.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    for (line, n) in top.into_iter().take(5) {
        report.notes.push(format!("workers logged {n}x: {line}"));
    }
}
