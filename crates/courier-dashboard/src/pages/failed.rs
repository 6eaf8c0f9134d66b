//! `/failed`: the messages in failure transports; one message with its error, stamps and body;
//! retry (the same [`retry_failed`] as `courier failed retry`) or remove one or all, after a
//! confirmation (the browser's `confirm()`, or a confirmation page without JavaScript).

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use courier_core::failed::{FailedMessage, retry_failed};
use courier_core::{Envelope, ErrorDetailsStamp};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{self, Nav};
use super::{csrf_field, encode, given};
use crate::error::{DashboardError, PageError};
use crate::guard::same_secret;
use crate::state::Shared;

/// How many messages per failure transport the list shows.
const LIST_MAX: usize = 200;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListParams {
    transport: Option<String>,
    /// `retried` or `removed`, after an action.
    done: Option<String>,
    n: Option<usize>,
}

/// The failure transports to show: the one asked for, else all.
fn names(shared: &Shared, asked: Option<&str>) -> Vec<String> {
    match asked {
        Some(name) => vec![name.to_owned()],
        None => shared.failure_names(),
    }
}

/// The failed messages of `names`, each with its summary.
pub(crate) async fn read(
    shared: &Shared,
    names: &[String],
    max: usize,
) -> Result<Vec<(FailedMessage, Envelope)>, DashboardError> {
    let mut out = Vec::new();
    for name in names {
        for e in shared.listable(name)?.list(max).await? {
            out.push((FailedMessage::new(name, &e), e));
        }
    }
    Ok(out)
}

/// A form posting `action` for one message (`id`) or all of a transport's.
fn action_form(shared: &Shared, action: &str, transport: &str, id: Option<&str>) -> Markup {
    let (label, class, question) = match (action, id) {
        ("retry", Some(id)) => (
            "Retry",
            "small",
            format!("Retry message {id} on its original transport?"),
        ),
        ("retry", None) => (
            "Retry all",
            "",
            format!("Retry every message in `{transport}`?"),
        ),
        (_, Some(id)) => (
            "Remove",
            "small danger",
            format!("Remove message {id} for good?"),
        ),
        (_, None) => (
            "Remove all",
            "danger",
            format!("Remove every message in `{transport}` for good?"),
        ),
    };
    html! {
        form.inline method="post" action={ "/failed/" (action) } data-confirm=(question) {
            (csrf_field(shared))
            input type="hidden" name="transport" value=(transport);
            @if let Some(id) = id {
                input type="hidden" name="id" value=(id);
            } @else {
                input type="hidden" name="all" value="1";
            }
            input type="hidden" name="confirmed" value="0";
            button class=(class) type="submit" data-action=(action) data-id=[id] { (label) }
        }
    }
}

pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<ListParams>,
) -> Result<Html<String>, PageError> {
    let names = names(&shared, given(params.transport.as_deref()));
    let notice = match (params.done.as_deref(), params.n) {
        (Some("retried"), Some(n)) => Some(format!("Retried {n} failed message(s).")),
        (Some("removed"), Some(n)) => Some(format!("Removed {n} failed message(s).")),
        _ => None,
    };
    let mut sections = Vec::new();
    for name in &names {
        let rows = read(&shared, std::slice::from_ref(name), LIST_MAX).await?;
        sections.push((name, rows));
    }
    let body = html! {
        h1 { "Failed messages" }
        @if let Some(n) = &notice { div.notice.ok #notice { (n) } }
        @if names.is_empty() {
            div.notice.info { "No failure transport is configured (set `failure_transport` on a transport)." }
        }
        @for (name, rows) in &sections {
            div.toolbar {
                h2 { (name) " (" (rows.len()) ")" }
                @if !rows.is_empty() {
                    (action_form(&shared, "retry", name, None))
                    (action_form(&shared, "remove", name, None))
                }
            }
            div.panel {
                @if rows.is_empty() {
                    div.empty { "No failed messages in " (name) "." }
                } @else {
                    table #failed {
                        thead { tr {
                            th { "Id" } th { "Type" } th { "Failed on" } th { "Error" }
                            th.num { "Retries" } th { "Failed at" } th { "" }
                        } }
                        tbody {
                            @for (m, _) in rows {
                                @let id = m.id.as_deref().unwrap_or("");
                                tr data-id=(id) {
                                    td.mono { a href={ "/failed/" (encode(name)) "/" (encode(id)) } { (id) } }
                                    td { (m.kind) }
                                    td { (layout::opt(m.transport.as_deref())) }
                                    td {
                                        @if let Some(c) = &m.error_class { span.badge.s-failed { (c) } " " }
                                        (layout::opt(m.error.as_deref()))
                                    }
                                    td.num { (m.retry_count) }
                                    td { (layout::opt(m.failed_at.as_deref())) }
                                    td {
                                        (action_form(&shared, "retry", name, Some(id)))
                                        " "
                                        (action_form(&shared, "remove", name, Some(id)))
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(super::html(layout::page(
        "Failed messages",
        Nav::Failed,
        body,
    )))
}

/// The body as text: the message as JSON, or the stored bytes of one that did not decode.
fn body_text(e: &Envelope) -> String {
    if let Some(raw) = e.undecodable_body() {
        return String::from_utf8_lossy(raw).into_owned();
    }
    match courier_core::encode(e) {
        Ok(encoded) => serde_json::from_str::<serde_json::Value>(&encoded.body)
            .ok()
            .and_then(|v| serde_json::to_string_pretty(&v).ok())
            .unwrap_or(encoded.body),
        Err(err) => format!("(cannot encode the message: {err})"),
    }
}

pub(crate) async fn detail(
    State(shared): State<Arc<Shared>>,
    Path((transport, id)): Path<(String, String)>,
) -> Result<Html<String>, PageError> {
    let e = shared
        .listable(&transport)?
        .find(&id)
        .await?
        .ok_or_else(|| {
            DashboardError::NotFound(format!("no failed message `{id}` in `{transport}`"))
        })?;
    let m = FailedMessage::new(&transport, &e);
    let details = e.last::<ErrorDetailsStamp>();
    let stamps: Vec<&str> = e.stamp_names().collect();
    let body = html! {
        p.muted { a href="/failed" { "← Failed messages" } }
        h1 { "Failed message " span.mono { (id) } }
        div.toolbar {
            (action_form(&shared, "retry", &transport, Some(&id)))
            (action_form(&shared, "remove", &transport, Some(&id)))
        }
        div.panel {
            dl.fields {
                dt { "Type" } dd { (m.kind) }
                dt { "Failed on" } dd { (layout::opt(m.transport.as_deref())) }
                dt { "Stored in" } dd { (transport) }
                dt { "Retries" } dd { (m.retry_count) }
                dt { "Failed at" } dd { (layout::opt(m.failed_at.as_deref())) }
                dt { "Error class" } dd { (layout::opt(m.error_class.as_deref())) }
                dt { "Error" } dd { (layout::opt(m.error.as_deref())) }
                @if let Some(d) = details {
                    @for cause in &d.chain {
                        dt { "Caused by" } dd { (cause) }
                    }
                }
                dt { "Stamps" } dd.mono { (stamps.join(", ")) }
            }
        }
        h2 { "Body" }
        pre #body { (body_text(&e)) }
    };
    Ok(super::html(layout::page(
        "Failed message",
        Nav::Failed,
        body,
    )))
}

/// What a retry or remove form posts.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    csrf: String,
    transport: String,
    id: Option<String>,
    all: Option<String>,
    confirmed: Option<String>,
}

/// The page that asks before acting, for a form posted without the script's confirmation.
fn confirmation(shared: &Shared, action: &str, form: &ActionForm) -> Markup {
    let what = match given(form.id.as_deref()) {
        Some(id) => format!("message {id} in `{}`", form.transport),
        None => format!("every message in `{}`", form.transport),
    };
    let verb = if action == "retry" { "Retry" } else { "Remove" };
    html! {
        h1 { "Confirm" }
        div.notice.info { (verb) " " (what) "?" }
        form method="post" action={ "/failed/" (action) } {
            (csrf_field(shared))
            input type="hidden" name="transport" value=(form.transport);
            @if let Some(id) = given(form.id.as_deref()) { input type="hidden" name="id" value=(id); }
            @if form.all.is_some() { input type="hidden" name="all" value="1"; }
            input type="hidden" name="confirmed" value="1";
            button.primary type="submit" { (verb) }
            " "
            a href="/failed" { "Cancel" }
        }
    }
}

async fn act(shared: &Shared, action: &str, form: ActionForm) -> Result<Response, PageError> {
    if !same_secret(&form.csrf, &shared.csrf) {
        return Err(DashboardError::Forbidden(
            "the form's CSRF token is missing or stale: reload the page and try again".into(),
        )
        .into());
    }
    if form.confirmed.as_deref() != Some("1") {
        let page = layout::page("Confirm", Nav::Failed, confirmation(shared, action, &form));
        return Ok(super::html(page).into_response());
    }
    let list = shared.listable(&form.transport)?;
    let envelopes = match (given(form.id.as_deref()), form.all.is_some()) {
        (Some(id), false) => vec![list.find(id).await?.ok_or_else(|| {
            DashboardError::NotFound(format!("no failed message `{id}` in `{}`", form.transport))
        })?],
        (None, true) => list.list(usize::MAX).await?,
        _ => {
            return Err(DashboardError::BadRequest("give one `id`, or `all`".into()).into());
        }
    };
    let mut n = 0;
    for e in envelopes {
        if action == "retry" {
            retry_failed(&shared.transports, list, e).await?;
        } else {
            list.remove(e.id().unwrap_or_default()).await?;
        }
        n += 1;
    }
    let done = if action == "retry" {
        "retried"
    } else {
        "removed"
    };
    Ok(Redirect::to(&format!(
        "/failed?transport={}&done={done}&n={n}",
        encode(&form.transport)
    ))
    .into_response())
}

pub(crate) async fn retry(
    State(shared): State<Arc<Shared>>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    act(&shared, "retry", form).await
}

pub(crate) async fn remove(
    State(shared): State<Arc<Shared>>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    act(&shared, "remove", form).await
}
