//! `/`: transports with depth, rate and pause state (a Pause/Resume button each), the keyed
//! queues' concurrency keys, runs by status, workers alive.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use maud::html;
use serde::Deserialize;

use super::layout::{self, Nav};
use crate::error::PageError;
use crate::state::Shared;

/// How many of the newest runs the overview lists.
const RECENT: usize = 8;

/// A rate for people: `+1.5/s`, `−0.2/s`, `steady`.
fn rate(per_second: Option<f64>) -> maud::Markup {
    match per_second {
        None => html! { span.muted title="needs two depth samples a few seconds apart" { "–" } },
        Some(r) if r.abs() < 0.005 => html! { span.muted { "steady" } },
        Some(r) if r > 0.0 => {
            html! { span.up title="the queue grows" { "+" (format!("{r:.2}")) "/s" } }
        }
        Some(r) => html! { span.down title="the queue drains" { "−" (format!("{:.2}", -r)) "/s" } },
    }
}

/// After a pause or resume: what was done to which transport.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct OverviewParams {
    done: Option<String>,
    transport: Option<String>,
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<OverviewParams>,
) -> Result<Html<String>, PageError> {
    let notice = match (
        params.done.as_deref(),
        super::given(params.transport.as_deref()),
    ) {
        (Some(done @ ("paused" | "resumed")), Some(t)) => Some(format!("Transport `{t}` {done}.")),
        _ => None,
    };
    let failure = shared.failure_names();
    let config = shared.transports.config();
    let mut rows = Vec::new();
    for (name, transport) in shared.transports.all() {
        let depth = match transport.as_message_count() {
            Some(c) => Some(c.message_count().await.map_err(|e| e.to_string())),
            None => None,
        };
        if let Some(Ok(d)) = &depth {
            shared.rates.record(name, *d);
        }
        let dsn = config
            .effective_dsn(name)
            .map(|d| d.to_string())
            .unwrap_or_default();
        let paused = match transport.as_pausable() {
            Some(p) => Some(p.is_paused().await.map_err(|e| e.to_string())),
            None => None,
        };
        rows.push((name.clone(), dsn, failure.contains(name), depth, paused));
    }
    let keys = super::keys::loads(&shared).await;
    let statuses = shared.store.count_by_status().await?;
    let recent = shared
        .store
        .page(&courier_runs::RunPageQuery::newest(RECENT))
        .await?;
    let total: u64 = statuses.iter().map(|(_, n)| n).sum();
    let workers = match shared.registry() {
        Some(r) => Some(r.list().await.map(|w| w.len()).map_err(|e| e.to_string())),
        None => None,
    };
    let failed_total: u64 = rows
        .iter()
        .filter(|r| r.2)
        .filter_map(|r| r.3.as_ref().and_then(|d| d.as_ref().ok()))
        .sum();
    let body = html! {
        h1 { "Overview" }
        @if let Some(n) = &notice { div.notice.ok #notice { (n) } }
        div.cards {
            div.card { div.label { "Runs" } div.value { (total) } }
            @for (status, n) in &statuses {
                a class={ "card st-" (status.as_str()) } href={ "/runs?status=" (status.as_str()) } {
                    div.label { (status.as_str().replace('_', " ")) }
                    div.value { (n) }
                }
            }
            a.card.st-failed href="/failed" { div.label { "Failed messages" } div.value { (failed_total) } }
            a.card href="/workers" {
                div.label { "Workers alive" }
                div.value {
                    @match &workers {
                        Some(Ok(n)) => (n),
                        Some(Err(_)) => span.muted title="the registry failed" { "?" },
                        None => span.muted { "–" },
                    }
                }
                @if workers.is_none() { div.hint { "no worker registry in this configuration" } }
            }
        }
        h2 { "Transports" }
        div.panel {
            table {
                thead { tr {
                    th { "Transport" } th { "DSN" } th { "Role" }
                    th.num { "Depth" } th.num title="net change of the depth per second, last minute" { "Rate" }
                    th title="a paused queue's workers fetch nothing until it is resumed" { "State" }
                } }
                tbody {
                    @for (name, dsn, is_failure, depth, paused) in &rows {
                        tr data-transport=(name) {
                            td { strong { (name) } }
                            td.mono.muted { (dsn) }
                            td {
                                @if *is_failure {
                                    a href={ "/failed?transport=" (super::encode(name)) } { "failure transport" }
                                } @else {
                                    "queue"
                                }
                            }
                            td.num {
                                @match depth {
                                    Some(Ok(d)) => (d),
                                    Some(Err(e)) => span.up title=(e) { "error" },
                                    None => span.muted title="this transport cannot count its messages" { "n/a" },
                                }
                            }
                            td.num { (rate(shared.rates.per_second(name))) }
                            td {
                                @match paused {
                                    Some(Ok(true)) => { span.badge.s-paused { "paused" } " " (super::pause::form(&shared, name, true)) },
                                    Some(Ok(false)) => { span.muted { "running" } " " (super::pause::form(&shared, name, false)) },
                                    Some(Err(e)) => span.up title=(e) { "error" },
                                    None => span.muted title="this transport cannot be paused (SQL and Redis transports can)" { "n/a" },
                                }
                            }
                        }
                    }
                }
            }
        }
        (super::keys::section(&keys))
        h2 { "Recent runs" }
        div.panel {
            @if recent.is_empty() {
                div.empty { "No runs yet." }
            } @else {
                (super::runs::table(&recent, super::layout::now_ms()))
            }
        }
        @if let Some(Err(e)) = &workers {
            div.notice.error.spaced { "The worker registry failed: " (e) }
        }
    };
    Ok(super::html(layout::page("Overview", Nav::Overview, body)))
}
