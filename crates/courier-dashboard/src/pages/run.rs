//! `/runs/{id}`: one run, its lease and owner, and the timeline of its events.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Html;
use courier_runs::{Run, RunEvent, RunStatus};
use maud::{Markup, html};
use uuid::Uuid;

use super::layout::{self, Nav};
use crate::error::{DashboardError, PageError};
use crate::state::Shared;

/// Parses a run id from the path.
pub(crate) fn parse_id(id: &str) -> Result<Uuid, DashboardError> {
    Uuid::parse_str(id)
        .map_err(|_| DashboardError::BadRequest(format!("`{id}` is not a run id (a UUID)")))
}

/// The run, or a 404.
pub(crate) async fn find(shared: &Shared, id: Uuid) -> Result<Run, DashboardError> {
    shared
        .store
        .find(id)
        .await?
        .ok_or_else(|| DashboardError::NotFound(format!("run {id} not found")))
}

/// One line of the timeline.
struct Entry {
    at: i64,
    class: &'static str,
    title: String,
    detail: Option<Markup>,
}

fn timeline(run: &Run, events: &[RunEvent], now: i64) -> Vec<Entry> {
    let mut entries = vec![Entry {
        at: run.created_at,
        class: "milestone",
        title: "created (queued)".into(),
        detail: None,
    }];
    if let Some(at) = run.started_at {
        entries.push(Entry {
            at,
            class: "milestone",
            title: "first claimed (running)".into(),
            detail: None,
        });
    }
    for e in events {
        entries.push(Entry {
            at: e.created_at,
            class: "event",
            title: format!("#{} {}", e.seq, e.kind),
            detail: Some(layout::json(&e.payload)),
        });
    }
    if run.status == RunStatus::Running && run.lease_expires > 0 {
        // Every heartbeat renews the lease and writes updated_at.
        let lease = if run.lease_expires < now {
            "lease expired: the reaper will requeue or dead-letter it".to_owned()
        } else {
            format!("lease expires {}", layout::relative(run.lease_expires, now))
        };
        entries.push(Entry {
            at: run.updated_at,
            class: "heartbeat",
            title: format!(
                "last heartbeat by {}",
                run.claimed_by.as_deref().unwrap_or("?")
            ),
            detail: Some(html! { span.muted { (lease) } }),
        });
    }
    if let Some(at) = run.finished_at {
        entries.push(Entry {
            at,
            class: if run.status == RunStatus::Failed {
                "end failed"
            } else {
                "end"
            },
            title: format!(
                "{}{}",
                run.status.as_str(),
                run.termination_reason
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ),
            detail: None,
        });
    }
    entries.sort_by_key(|e| e.at);
    entries
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let id = parse_id(&id)?;
    let run = find(&shared, id).await?;
    let events = shared.store.events(id).await?;
    let now = layout::now_ms();
    let lease = if run.lease_expires > 0 {
        html! { (layout::time(run.lease_expires)) " " span.muted { "(" (layout::relative(run.lease_expires, now)) ")" } }
    } else {
        html! { span.muted { "no lease" } }
    };
    let body = html! {
        p.muted { a href="/runs" { "← Runs" } }
        h1 { "Run " span.mono { (run.id) } " " (layout::status(run.status)) }
        div.grid2 {
            div.panel {
                dl.fields {
                    dt { "Agent" } dd { (run.agent) }
                    dt { "Status" } dd { (layout::status(run.status)) }
                    dt { "Termination reason" } dd { (layout::opt(run.termination_reason.map(|t| t.as_str()))) }
                    dt { "Error class" } dd { (layout::opt(run.error_class.map(|c| c.as_str()))) }
                    dt { "Owner (claimed by)" } dd.mono { (layout::opt(run.claimed_by.as_deref())) }
                    dt { "Lease expires" } dd { (lease) }
                    dt { "Requeues" } dd { (run.requeue_count) }
                    dt { "Pending effect" } dd { (layout::opt(run.pending_effect.as_deref())) }
                    dt { "Created" } dd { (layout::time(run.created_at)) }
                    dt { "Started" } dd { (layout::time_opt(run.started_at)) }
                    dt { "Finished" } dd { (layout::time_opt(run.finished_at)) }
                    dt { "Updated" } dd { (layout::time(run.updated_at)) }
                }
            }
            div {
                div.panel {
                    div.panel-title { "Timeline · " (events.len()) " event(s)" }
                    ol.timeline #timeline {
                        @for e in timeline(&run, &events, now) {
                            li class=(e.class) {
                                span.kind { (e.title) }
                                span.when { (layout::time(e.at)) }
                                @if let Some(d) = e.detail { div { (d) } }
                            }
                        }
                    }
                }
            }
        }
        div.grid2 {
            div {
                h2 { "Input" }
                (layout::json(&run.input))
            }
            @if let Some(output) = &run.output {
                div {
                    h2 { "Output" }
                    (layout::json(output))
                }
            }
        }
        p.muted { "JSON: " a href={ "/api/runs/" (run.id) } { "/api/runs/" (run.id) } }
    };
    Ok(super::html(layout::page("Run", Nav::Runs, body)))
}
