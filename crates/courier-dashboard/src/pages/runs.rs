//! `/runs`: runs newest first, filtered by status and agent, keyset-paginated
//! ([`RunStore::page`](courier_runs::RunStore::page)), and the find-by-id box.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use courier_runs::{PageFrom, Run, RunCursor, RunPageQuery, RunStatus};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::layout::{self, Nav};
use super::{encode, given};
use crate::error::{DashboardError, PageError};
use crate::state::Shared;

/// The query of `/runs` and `/api/runs`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RunsParams {
    pub(crate) status: Option<String>,
    pub(crate) agent: Option<String>,
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
    pub(crate) limit: Option<usize>,
    /// Find a run by id.
    pub(crate) id: Option<String>,
}

impl RunsParams {
    /// The store query (without the limit's extra row).
    pub(crate) fn query(&self, default_limit: usize) -> Result<RunPageQuery, DashboardError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            DashboardError::BadRequest(format!("{what}: {e}"))
        };
        let cursor = |v: &str| v.parse::<RunCursor>().map_err(|e| bad("cursor", &e));
        let mut q = RunPageQuery::newest(self.limit.unwrap_or(default_limit).clamp(1, 500));
        if let Some(s) = given(self.status.as_deref()) {
            q = q.status(s.parse::<RunStatus>().map_err(|e| bad("status", &e))?);
        }
        if let Some(a) = given(self.agent.as_deref()) {
            q = q.agent(a);
        }
        q = match (given(self.before.as_deref()), given(self.after.as_deref())) {
            (Some(b), None) => q.from(PageFrom::Before(cursor(b)?)),
            (None, Some(a)) => q.from(PageFrom::After(cursor(a)?)),
            (None, None) => q,
            (Some(_), Some(_)) => {
                return Err(DashboardError::BadRequest(
                    "give `before` or `after`, not both".into(),
                ));
            }
        };
        Ok(q)
    }
}

/// One page of runs, and whether there are newer and older ones.
pub(crate) struct Page {
    pub(crate) runs: Vec<Run>,
    pub(crate) newer: bool,
    pub(crate) older: bool,
}

/// Reads the page `q` asks for, one run more than its limit to know whether more follow.
pub(crate) async fn read_page(shared: &Shared, q: &RunPageQuery) -> Result<Page, DashboardError> {
    let mut probe = q.clone();
    probe.limit = q.limit.saturating_add(1);
    let mut runs = shared.store.page(&probe).await?;
    let more = runs.len() > q.limit;
    let (newer, older) = match q.from {
        PageFrom::Newest => {
            runs.truncate(q.limit);
            (false, more)
        }
        PageFrom::Before(_) => {
            runs.truncate(q.limit);
            (true, more)
        }
        PageFrom::After(_) => {
            if more {
                runs.remove(0);
            }
            (more, true)
        }
    };
    Ok(Page { runs, newer, older })
}

/// Runs as a table, newest first.
pub(crate) fn table(runs: &[Run], now: i64) -> Markup {
    html! {
        table {
            thead { tr {
                th { "Run" } th { "Agent" } th { "Status" } th { "Reason" }
                th.num { "Requeues" } th { "Created" } th { "Updated" }
            } }
            tbody {
                @for r in runs {
                    tr {
                        td.mono { a href={ "/runs/" (r.id) } { (r.id) } }
                        td { (r.agent) }
                        td { (layout::status(r.status)) }
                        td { (layout::opt(r.termination_reason.map(|t| t.as_str()))) }
                        td.num { (r.requeue_count) }
                        td { (layout::time(r.created_at)) }
                        td.muted { (layout::relative(r.updated_at, now)) }
                    }
                }
            }
        }
    }
}

pub(crate) async fn page(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<RunsParams>,
) -> Result<Response, PageError> {
    let mut notice = None;
    if let Some(id) = given(params.id.as_deref()) {
        match Uuid::parse_str(id) {
            Ok(uuid) if shared.store.find(uuid).await?.is_some() => {
                return Ok(Redirect::to(&format!("/runs/{uuid}")).into_response());
            }
            Ok(_) => notice = Some(format!("No run with id {id}.")),
            Err(_) => notice = Some(format!("`{id}` is not a run id (a UUID).")),
        }
    }
    let q = params.query(shared.page_size())?;
    let page = read_page(&shared, &q).await?;
    let filters = {
        let mut f = String::new();
        if let Some(s) = q.status {
            f.push_str(&format!("&status={}", s.as_str()));
        }
        if let Some(a) = &q.agent {
            f.push_str(&format!("&agent={}", encode(a)));
        }
        f
    };
    let now = layout::now_ms();
    let body = html! {
        h1 { "Runs" }
        @if let Some(n) = &notice { div.notice.info { (n) } }
        div.toolbar {
            form method="get" action="/runs" class="toolbar" {
                label { "Status"
                    select name="status" {
                        option value="" { "any" }
                        @for s in RunStatus::ALL {
                            option value=(s.as_str()) selected[q.status == Some(s)] { (s.as_str().replace('_', " ")) }
                        }
                    }
                }
                label { "Agent" input type="text" name="agent" value=[q.agent.as_deref()] placeholder="any"; }
                button.primary type="submit" { "Filter" }
            }
            form method="get" action="/runs" class="toolbar" {
                label { "Find a run by id"
                    input.wide.mono type="search" name="id" placeholder="00000000-0000-0000-0000-000000000000";
                }
                button type="submit" { "Find" }
            }
        }
        div.panel {
            @if page.runs.is_empty() {
                div.empty { "No runs match." }
            } @else {
                (table(&page.runs, now))
            }
            div.pager {
                span {
                    @if page.newer {
                        @if let Some(first) = page.runs.first() {
                            a href={ "/runs?after=" (RunCursor::of(first)) (filters) } { "← Newer" }
                        } @else {
                            a href={ "/runs?" (filters.trim_start_matches('&')) } { "← Newest" }
                        }
                    }
                }
                span.muted { (page.runs.len()) " run(s) on this page" }
                span {
                    @if page.older {
                        @if let Some(last) = page.runs.last() {
                            a href={ "/runs?before=" (RunCursor::of(last)) (filters) } { "Older →" }
                        }
                    }
                }
            }
        }
    };
    Ok(super::html(layout::page("Runs", Nav::Runs, body)).into_response())
}
