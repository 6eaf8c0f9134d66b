//! `/api/`: the dashboard's data as JSON, in the shapes of the CLI's `--format json` (the same
//! builders: [`Run::to_json`](courier_runs::Run::to_json), [`FailedMessage`], the stats map and
//! [`WorkerRecord`](courier_core::WorkerRecord)). Read-only: GET never changes state.
//!
//! `/api/runs` takes the query of `/runs` (`status`, `agent`, `limit`, `before`, `after`) and
//! answers a JSON array, newest first; the cursor of the next (older) page, when there is one,
//! is in the `x-next-cursor` header (pass it as `before`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use courier_core::failed::FailedMessage;
use courier_core::{KeyLoads, WorkerRecord};
use courier_runs::{Run, RunCursor, RunEvent};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, DashboardError};
use crate::pages::failed::read;
use crate::pages::runs::{RunsParams, read_page};
use crate::pages::workers::NO_REGISTRY;
use crate::pages::{find, parse_id};
use crate::state::Shared;

pub(crate) async fn runs(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<RunsParams>,
) -> Result<Response, ApiError> {
    let q = params.query(shared.page_size())?;
    let page = read_page(&shared, &q).await?;
    let next = page
        .older
        .then(|| page.runs.last().map(|r| RunCursor::of(r).to_string()))
        .flatten();
    let body: Vec<Value> = page.runs.iter().map(Run::to_json).collect();
    let mut response = Json(body).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-cursor", next);
    }
    Ok(response)
}

pub(crate) async fn run(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let run = find(&shared, id).await?;
    let events = shared.store.events(id).await?;
    let steps = shared.store.steps(id).await?;
    Ok(Json(run.to_json_with_steps(&events, &steps)))
}

pub(crate) async fn events(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<Vec<Value>>, ApiError> {
    let id = parse_id(&id)?;
    find(&shared, id).await?;
    let events = shared.store.events(id).await?;
    Ok(Json(events.iter().map(RunEvent::to_json).collect()))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FailedParams {
    transport: Option<String>,
    max: Option<usize>,
}

pub(crate) async fn failed(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<FailedParams>,
) -> Result<Json<Vec<FailedMessage>>, ApiError> {
    let names = match crate::pages::given(params.transport.as_deref()) {
        Some(n) => vec![n.to_owned()],
        None => shared.failure_names(),
    };
    let max = params.max.unwrap_or(50);
    let mut rows: Vec<FailedMessage> = read(&shared, &names, max)
        .await?
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    rows.truncate(max);
    Ok(Json(rows))
}

pub(crate) async fn stats(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<BTreeMap<String, Option<u64>>>, ApiError> {
    Ok(Json(shared.transports.message_counts(&[]).await?))
}

/// `courier stats --keys --format json`'s shape: per keyed queue, its busiest keys and `other`.
pub(crate) async fn keys(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<BTreeMap<String, KeyLoads>>, ApiError> {
    let mut out = BTreeMap::new();
    for (name, loads) in crate::pages::keys::loads(&shared).await {
        out.insert(name, loads.map_err(DashboardError::from)?);
    }
    Ok(Json(out))
}

pub(crate) async fn workers(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<Vec<WorkerRecord>>, ApiError> {
    let registry = shared
        .registry()
        .ok_or_else(|| DashboardError::NotFound(NO_REGISTRY.into()))?;
    Ok(Json(registry.list().await?))
}
