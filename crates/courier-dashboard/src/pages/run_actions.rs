//! The run page's actions, through the dashboard's [`Runtime`]: send a waiting run its signal
//! ([`Runtime::signal`]), resolve the guarded step a run parked on ([`Runtime::resolve_step`]:
//! retry, skip with a result, fail), approve a run waiting for approval and give a run waiting
//! for input its input ([`Runtime::approve`], [`Runtime::provide_input`], resumed in a task of
//! the dashboard's process). Posted like every action: the CSRF token, then a confirmation (the
//! browser's `confirm()`, or a confirmation page without JavaScript); then back to the run page
//! with a notice.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use courier_runs::{Resolution, Run, RunStatus, Runtime, SignalSent, StepRecord, StepStatus};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::layout::{self, Nav};
use super::{csrf_field, given};
use crate::error::{DashboardError, PageError};
use crate::guard::same_secret;
use crate::pages::{find, parse_id};
use crate::state::Shared;

/// Who a signal is from when its form does not say.
const DEFAULT_SENDER: &str = "dashboard";

/// The guarded step a run `waiting_for_approval` is parked on: its newest intent.
pub(crate) fn parked(run: &Run, steps: &[StepRecord]) -> Option<StepRecord> {
    if run.status != RunStatus::WaitingForApproval {
        return None;
    }
    steps
        .iter()
        .rev()
        .find(|s| s.status == StepStatus::Intent)
        .cloned()
}

/// The forms for what can be done to `run` now, or `None` when nothing can.
pub(crate) fn forms(shared: &Shared, run: &Run, parked: Option<&StepRecord>) -> Option<Markup> {
    let base = format!("/runs/{}", run.id);
    let form = |action: &str, question: String, fields: Markup, button: Markup| {
        html! {
            form method="post" action={ (base) "/" (action) } data-confirm=(question) {
                (csrf_field(shared))
                input type="hidden" name="confirmed" value="0";
                (fields)
                (button)
            }
        }
    };
    let markup = match (run.status, &run.wait_signal, parked) {
        (RunStatus::Waiting, Some(signal), _) => form(
            "signal",
            format!("Send signal `{signal}` to run {}?", run.id),
            html! {
                input type="hidden" name="name" value=(signal);
                label { "Data (JSON)" textarea name="data" { "null" } }
                label { "From" input type="text" name="by" placeholder=(DEFAULT_SENDER); }
            },
            html! { button.primary type="submit" data-action="signal" { "Send signal `" (signal) "`" } },
        ),
        (RunStatus::WaitingForApproval, _, Some(step)) => {
            let name = format!("step {}: {}", step.index, step.name);
            html! {
                p.muted {
                    "Parked on " strong { (name) } ", a guarded step that began and never recorded a \
                     result: its effect may or may not have happened."
                }
                (form(
                    "resolve",
                    format!("Run {name} again, with the same idempotency key?"),
                    html! { input type="hidden" name="action" value="retry"; },
                    html! { button type="submit" data-action="retry" { "Retry the step" } },
                ))
                (form(
                    "resolve",
                    format!("Skip {name}, journaling this result for it?"),
                    html! {
                        input type="hidden" name="action" value="skip";
                        label { "Result (JSON)" textarea name="result" { "null" } }
                    },
                    html! { button type="submit" data-action="skip" { "Skip it with this result" } },
                ))
                (form(
                    "resolve",
                    format!("Fail run {} at {name}?", run.id),
                    html! { input type="hidden" name="action" value="fail"; },
                    html! { button.danger type="submit" data-action="fail" { "Fail the run" } },
                ))
            }
        }
        (RunStatus::WaitingForApproval, _, None) => form(
            "approve",
            format!(
                "Approve run {}? It resumes in the dashboard's process.",
                run.id
            ),
            html! {},
            html! { button.primary type="submit" data-action="approve" { "Approve" } },
        ),
        (RunStatus::WaitingForInput, _, _) => form(
            "input",
            format!(
                "Give run {} this input? It resumes in the dashboard's process.",
                run.id
            ),
            html! { label { "Input (JSON)" textarea name="data" {} } },
            html! { button.primary type="submit" data-action="input" { "Give input" } },
        ),
        _ => return None,
    };
    Some(match shared.options.runtime {
        Some(_) => markup,
        None => html! {
            div.notice.info {
                "This dashboard has no run runtime, so it cannot act on runs (`courier dashboard` \
                 wires one; an application passes DashboardOptions::runtime)."
            }
        },
    })
}

/// The notice a run page shows after an action (`?done=`).
pub(crate) fn notice(done: &str) -> Option<&'static str> {
    Some(match done {
        "signal-woken" => "Signal sent: the run was woken and queued.",
        "signal-buffered" => {
            "Signal recorded: the run is not waiting for it yet; its wait will find it."
        }
        "retry" => "The step runs again with the same key: the run is queued.",
        "skip" => "The step was skipped with the given result: the run is queued.",
        "fail" => "The run was failed (class ambiguous_effect).",
        "approved" => "Approved: the run resumes in the dashboard's process (reload to follow it).",
        "input" => "Input given: the run resumes in the dashboard's process (reload to follow it).",
        _ => return None,
    })
}

/// What the action forms post (each uses its own fields).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    csrf: String,
    confirmed: Option<String>,
    /// The signal's name.
    name: Option<String>,
    /// The signal's data, or the input (JSON).
    data: Option<String>,
    /// Who sends the signal.
    by: Option<String>,
    /// `retry`, `skip` or `fail`.
    action: Option<String>,
    /// A skipped step's result (JSON).
    result: Option<String>,
}

/// A JSON field; blank is `null` unless `required`.
fn json_field(field: &str, text: Option<&str>, required: bool) -> Result<Value, DashboardError> {
    match given(text) {
        Some(t) => serde_json::from_str(t)
            .map_err(|e| DashboardError::BadRequest(format!("{field}: invalid JSON: {e}"))),
        None if required => Err(DashboardError::BadRequest(format!(
            "{field}: give a JSON value"
        ))),
        None => Ok(Value::Null),
    }
}

/// The page that asks before acting, for a form posted without the script's confirmation: the
/// same fields, confirmed.
fn confirmation(shared: &Shared, id: Uuid, path: &str, what: &str, form: &ActionForm) -> Markup {
    let fields = [
        ("name", &form.name),
        ("data", &form.data),
        ("by", &form.by),
        ("action", &form.action),
        ("result", &form.result),
    ];
    html! {
        h1 { "Confirm" }
        div.notice.info { (what) " run " span.mono { (id) } "?" }
        form method="post" action={ "/runs/" (id) "/" (path) } {
            (csrf_field(shared))
            @for (name, value) in fields {
                @if let Some(v) = value { input type="hidden" name=(name) value=(v); }
            }
            input type="hidden" name="confirmed" value="1";
            button.primary type="submit" { "Confirm" }
            " "
            a href={ "/runs/" (id) } { "Cancel" }
        }
    }
}

/// The checks every action makes: the CSRF token, a runtime, the run id, the confirmation.
/// `Err(response)`: the confirmation page to answer instead.
fn prepare<'s>(
    shared: &'s Shared,
    id: &str,
    path: &str,
    what: &str,
    form: &ActionForm,
) -> Result<Result<(&'s Runtime, Uuid), Response>, PageError> {
    if !same_secret(&form.csrf, &shared.csrf) {
        return Err(DashboardError::Forbidden(
            "the form's CSRF token is missing or stale: reload the page and try again".into(),
        )
        .into());
    }
    let runtime = shared.options.runtime.as_ref().ok_or_else(|| {
        DashboardError::BadRequest(
            "this dashboard has no run runtime, so it cannot act on runs".into(),
        )
    })?;
    let id = parse_id(id)?;
    if form.confirmed.as_deref() != Some("1") {
        let page = layout::page(
            "Confirm",
            Nav::Runs,
            confirmation(shared, id, path, what, form),
        );
        return Ok(Err(super::html(page).into_response()));
    }
    Ok(Ok((runtime, id)))
}

fn back(id: Uuid, done: &str) -> Response {
    Redirect::to(&format!("/runs/{id}?done={done}")).into_response()
}

/// `POST /runs/{id}/signal`: `name`, `data` (JSON, default null), `by`.
pub(crate) async fn signal(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    let (runtime, id) = match prepare(&shared, &id, "signal", "Send this signal to", &form)? {
        Ok(ready) => ready,
        Err(confirm) => return Ok(confirm),
    };
    let name = given(form.name.as_deref())
        .ok_or_else(|| DashboardError::BadRequest("name: give the signal's name".into()))?;
    let data = json_field("data", form.data.as_deref(), false)?;
    let by = given(form.by.as_deref()).unwrap_or(DEFAULT_SENDER);
    let sent = runtime.signal(id, name, data, Some(by)).await?;
    tracing::info!(courier.run.id = %id, signal = name, by, ?sent, "signal sent from the dashboard");
    Ok(back(
        id,
        match sent {
            SignalSent::Woken => "signal-woken",
            _ => "signal-buffered",
        },
    ))
}

/// `POST /runs/{id}/resolve`: `action` (`retry`, `skip`, `fail`), `result` (JSON, with skip).
pub(crate) async fn resolve(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    let (runtime, id) = match prepare(&shared, &id, "resolve", "Resolve the parked step of", &form)?
    {
        Ok(ready) => ready,
        Err(confirm) => return Ok(confirm),
    };
    let (done, resolution) = match given(form.action.as_deref()) {
        Some("retry") => ("retry", Resolution::Retry),
        Some("skip") => (
            "skip",
            Resolution::Skip(json_field("result", form.result.as_deref(), false)?),
        ),
        Some("fail") => ("fail", Resolution::Fail),
        other => {
            return Err(DashboardError::BadRequest(format!(
                "action: `{}` is not retry, skip or fail",
                other.unwrap_or("")
            ))
            .into());
        }
    };
    runtime.resolve_step(id, resolution).await?;
    tracing::info!(courier.run.id = %id, resolution = done, "parked step resolved from the dashboard");
    Ok(back(id, done))
}

/// Checks that the run is in `status` (and, waiting for approval, not parked on a step), then
/// resumes it in a task of its own: the agent may run long after the answer.
async fn resume(
    shared: &Shared,
    runtime: &Runtime,
    id: Uuid,
    status: RunStatus,
    input: Option<Value>,
) -> Result<(), PageError> {
    let run = find(shared, id).await?;
    if run.status != status {
        return Err(DashboardError::from(courier_runs::RunError::WrongStatus {
            run_id: id,
            status: run.status,
            expected: status,
        })
        .into());
    }
    if let Some(step) = parked(&run, &shared.store.steps(id).await?) {
        return Err(DashboardError::BadRequest(format!(
            "run {id} is parked on step {}: {}, a guarded step: resolve it (retry, skip or fail) \
             instead of approving it",
            step.index, step.name
        ))
        .into());
    }
    let runtime = runtime.clone();
    tokio::spawn(async move {
        let resumed = match input {
            Some(input) => runtime.provide_input(id, input).await,
            None => runtime.approve(id).await,
        };
        match resumed {
            Ok(outcome) => {
                tracing::info!(courier.run.id = %id, ?outcome, "run resumed from the dashboard")
            }
            Err(e) => {
                tracing::warn!(courier.run.id = %id, error = %courier_core::error_chain(&e), "run resumed from the dashboard failed")
            }
        }
    });
    Ok(())
}

/// `POST /runs/{id}/approve`.
pub(crate) async fn approve(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    let (runtime, id) = match prepare(&shared, &id, "approve", "Approve", &form)? {
        Ok(ready) => ready,
        Err(confirm) => return Ok(confirm),
    };
    resume(&shared, runtime, id, RunStatus::WaitingForApproval, None).await?;
    Ok(back(id, "approved"))
}

/// `POST /runs/{id}/input`: `data` (JSON).
pub(crate) async fn input(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> Result<Response, PageError> {
    let (runtime, id) = match prepare(&shared, &id, "input", "Give this input to", &form)? {
        Ok(ready) => ready,
        Err(confirm) => return Ok(confirm),
    };
    let data = json_field("data", form.data.as_deref(), true)?;
    resume(&shared, runtime, id, RunStatus::WaitingForInput, Some(data)).await?;
    Ok(back(id, "input"))
}
