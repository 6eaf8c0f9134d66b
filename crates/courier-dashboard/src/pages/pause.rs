//! Pause and resume a queue from the overview: the same flag as `courier pause|resume T`
//! ([`Pausable`](courier_core::Pausable), kept in the transport's own server), so the workers
//! of that transport on every host stop fetching from it within a second, and start again.
//! Posted like every action: the CSRF token, then a confirmation (the browser's `confirm()`, or
//! a confirmation page without JavaScript).

use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use courier_core::Pausable;
use maud::{Markup, html};
use serde::Deserialize;

use super::csrf_field;
use super::layout::{self, Nav};
use crate::error::{DashboardError, PageError};
use crate::guard::same_secret;
use crate::state::Shared;

/// What the pause and resume forms post.
#[derive(Debug, Deserialize)]
pub(crate) struct PauseForm {
    #[serde(default)]
    csrf: String,
    transport: String,
    confirmed: Option<String>,
}

/// The action of a form: its path, its button and the verb of its notice.
fn action(paused: bool) -> (&'static str, &'static str, &'static str) {
    if paused {
        ("pause", "Pause", "paused")
    } else {
        ("resume", "Resume", "resumed")
    }
}

/// The Pause (queue running) or Resume (queue paused) button of one transport.
pub(crate) fn form(shared: &Shared, transport: &str, paused_now: bool) -> Markup {
    let (path, label, _) = action(!paused_now);
    let question = if paused_now {
        format!("Resume `{transport}`? Its workers start fetching again.")
    } else {
        format!("Pause `{transport}`? Its workers on every host stop fetching from it.")
    };
    let class = if paused_now { "small primary" } else { "small" };
    html! {
        form.inline method="post" action={ "/transports/" (path) } data-confirm=(question) {
            (csrf_field(shared))
            input type="hidden" name="transport" value=(transport);
            input type="hidden" name="confirmed" value="0";
            button class=(class) type="submit" data-action=(path) data-transport=(transport) { (label) }
        }
    }
}

/// The transport `name`, pausable.
fn pausable<'s>(shared: &'s Shared, name: &str) -> Result<&'s dyn Pausable, DashboardError> {
    let transport = shared
        .transports
        .get(name)
        .ok_or_else(|| DashboardError::NotFound(format!("no transport `{name}`")))?;
    transport.as_pausable().ok_or_else(|| {
        DashboardError::BadRequest(format!(
            "transport `{name}` cannot be paused (SQL and Redis transports can)"
        ))
    })
}

async fn set(shared: &Shared, paused: bool, form: PauseForm) -> Result<Response, PageError> {
    if !same_secret(&form.csrf, &shared.csrf) {
        return Err(DashboardError::Forbidden(
            "the form's CSRF token is missing or stale: reload the page and try again".into(),
        )
        .into());
    }
    let target = pausable(shared, &form.transport)?;
    let (path, label, done) = action(paused);
    if form.confirmed.as_deref() != Some("1") {
        let body = html! {
            h1 { "Confirm" }
            div.notice.info { (label) " the queue of `" (form.transport) "`?" }
            form method="post" action={ "/transports/" (path) } {
                (csrf_field(shared))
                input type="hidden" name="transport" value=(form.transport);
                input type="hidden" name="confirmed" value="1";
                button.primary type="submit" { (label) }
                " "
                a href="/" { "Cancel" }
            }
        };
        let page = layout::page("Confirm", Nav::Overview, body);
        return Ok(super::html(page).into_response());
    }
    target.set_paused(paused).await?;
    tracing::info!(messaging.destination.name = %form.transport, paused, "queue paused or resumed from the dashboard");
    Ok(Redirect::to(&format!(
        "/?done={done}&transport={}",
        super::encode(&form.transport)
    ))
    .into_response())
}

pub(crate) async fn pause(
    State(shared): State<Arc<Shared>>,
    Form(form): Form<PauseForm>,
) -> Result<Response, PageError> {
    set(&shared, true, form).await
}

pub(crate) async fn resume(
    State(shared): State<Arc<Shared>>,
    Form(form): Form<PauseForm>,
) -> Result<Response, PageError> {
    set(&shared, false, form).await
}
