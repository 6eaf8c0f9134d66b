//! `/runs/{id}`: one run, its lease and owner, its budget and pending wait, its step journal,
//! the timeline of its events, and the actions it can take (see [`run_actions`](super::run_actions)).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::Html;
use courier_runs::{Budget, Run, RunEvent, RunStatus, StepRecord, StepStatus, Usage};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, Nav};
use super::{find, parse_id};
use crate::error::PageError;
use crate::state::Shared;

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

/// How much of a step's result the steps table shows (the whole is in `/api/runs/{id}`).
const RESULT_CHARS: usize = 200;

/// `text` cut to `max` characters, ending with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The non-zero parts of a usage, `–` when nothing was used.
fn usage(u: &Usage) -> Markup {
    let parts: Vec<String> = [
        ("in", u.tokens_in),
        ("out", u.tokens_out),
        ("cost", u.cost_micros),
        ("tools", u.tool_calls),
        ("turns", u.turns),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| format!("{k} {n}"))
    .collect();
    layout::opt((!parts.is_empty()).then(|| parts.join(", ")).as_deref())
}

/// Each limit set, `used / limit`; `unlimited` without one.
fn budget(run: &Run, now: i64) -> Markup {
    let Some(b) = run.budget.filter(|b: &Budget| !b.is_unlimited()) else {
        return html! { span.muted { "unlimited" } };
    };
    let used = &run.usage;
    let wall = run.started_at.map_or(0, |start| {
        u64::try_from(run.finished_at.unwrap_or(now) - start).unwrap_or(0)
    });
    let rows = [
        ("tokens in", used.tokens_in, b.tokens_in),
        ("tokens out", used.tokens_out, b.tokens_out),
        ("cost (micros)", used.cost_micros, b.cost_micros),
        ("tool calls", used.tool_calls, b.tool_calls),
        ("turns", used.turns, b.turns),
        ("wall time (ms)", wall, b.wall_time_ms),
    ];
    html! {
        ul.budget #budget {
            @for (name, used, limit) in rows {
                @if let Some(limit) = limit {
                    li class=[(used >= limit).then_some("up")] { (name) " " (used) " / " (limit) }
                }
            }
        }
    }
}

/// What a waiting run waits for, and when it wakes.
fn wait(run: &Run, now: i64) -> Option<Markup> {
    if run.status != RunStatus::Waiting {
        return None;
    }
    let wakes = run.to_json()["wakes_at"].is_string().then_some(run.due_at);
    let when = match wakes {
        Some(at) => {
            html! { ", wakes " (layout::time(at)) " " span.muted { "(" (layout::relative(at, now)) ")" } }
        }
        None => html! { span.muted { ", no timeout" } },
    };
    Some(match &run.wait_signal {
        Some(signal) => html! { span #wait { "signal " code { (signal) } (when) } },
        None => html! { span #wait { "a durable sleep" (when) } },
    })
}

/// The step journal as a table.
fn steps_table(steps: &[StepRecord]) -> Markup {
    html! {
        table #steps {
            thead { tr {
                th.num { "Step" } th { "Name" } th { "Effect" } th { "Status" }
                th.num { "Duration" } th.num { "Ran" } th { "Usage" } th { "Result" }
            } }
            tbody {
                @for s in steps {
                    tr data-step=(s.index) {
                        td.num { (s.index) }
                        td { (s.name) }
                        td { (s.effect) }
                        td { span class={ "badge st-" (s.status.as_str()) } { (s.status.as_str()) } }
                        td.num { (s.duration_ms) " ms" }
                        td.num { (s.attempts) "×" }
                        td { (usage(&s.usage)) }
                        td.mono {
                            @if let Some(e) = &s.error {
                                span.badge.s-failed { (s.error_class.as_deref().unwrap_or("error")) } " " (cut(e, RESULT_CHARS))
                            } @else if s.status == StepStatus::Waiting {
                                span.muted { "waiting" }
                            } @else if let Some(o) = &s.output {
                                (cut(&o.to_string(), RESULT_CHARS))
                            } @else {
                                span.muted { "–" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The query of a run page: the action just done.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RunParams {
    done: Option<String>,
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(params): Query<RunParams>,
) -> Result<Html<String>, PageError> {
    let id = parse_id(&id)?;
    let run = find(&shared, id).await?;
    let events = shared.store.events(id).await?;
    let steps = shared.store.steps(id).await?;
    let now = layout::now_ms();
    let parked = super::run_actions::parked(&run, &steps);
    let actions = super::run_actions::forms(&shared, &run, parked.as_ref());
    let notice = params.done.as_deref().and_then(super::run_actions::notice);
    let lease = if run.lease_expires > 0 {
        html! { (layout::time(run.lease_expires)) " " span.muted { "(" (layout::relative(run.lease_expires, now)) ")" } }
    } else {
        html! { span.muted { "no lease" } }
    };
    let body = html! {
        p.muted { a href="/runs" { "← Runs" } }
        h1 { "Run " span.mono { (run.id) } " " (layout::status(run.status)) }
        @if let Some(n) = notice { div.notice.ok #notice { (n) } }
        @if let Some(actions) = actions {
            div.panel.actions #actions {
                div.panel-title { "Actions" }
                div.panel-body { (actions) }
            }
        }
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
                    @if let Some(w) = wait(&run, now) { dt { "Waiting for" } dd { (w) } }
                    dt { "Budget" } dd { (budget(&run, now)) }
                    dt { "Usage" } dd { (usage(&run.usage)) }
                    dt { "Steps replayed" } dd { (run.steps_replayed) }
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
        @if !steps.is_empty() {
            h2 { "Steps · " (steps.len()) }
            div.panel { (steps_table(&steps)) }
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
