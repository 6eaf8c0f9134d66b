//! `GET /runs/{id}/stream`: a run's token stream as server-sent events, live, resuming after the
//! `Last-Event-ID` a reconnecting reader sends (or `?after=OFFSET`).
//!
//! Each event of the [`StreamSource`](crate::StreamSource) goes out as `id: OFFSET`, `event:
//! chunk | retry | done` and its text as `data:` lines; the offsets come from the store, so a
//! reader that reconnects to this dashboard or to another one (after a restart) sees no gap and
//! no duplicate. The response polls the store every [`POLL`] and ends once the run is finished
//! and nothing is left to send.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::ApiError;
use crate::pages::{find, parse_id};
use crate::state::{Shared, StreamEventView};

/// How often a live response reads the store again.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// Events read at a time.
const BATCH: usize = 200;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct StreamParams {
    after: Option<i64>,
}

/// One event as SSE text.
fn frame(e: &StreamEventView) -> String {
    let mut out = format!("id: {}\nevent: {}\n", e.offset, e.kind);
    for line in e.data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.trim_end_matches('\r'));
        out.push('\n');
    }
    out.push('\n');
    out
}

pub(crate) async fn stream(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(params): Query<StreamParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    find(&shared, id).await?;
    let Some(source) = shared.options.streams.clone() else {
        return Ok((
            StatusCode::NOT_FOUND,
            "no token streams in this dashboard's configuration",
        )
            .into_response());
    };
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .or(params.after)
        .unwrap_or(0);
    let run = id.to_string();
    let state = (shared, source, run, id, after, false);
    let body = futures_util::stream::unfold(
        state,
        |(shared, source, run, id, after, finished)| async move {
            if finished {
                return None;
            }
            loop {
                let events = match source.read(&run, after, BATCH).await {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::warn!(run = %run, error = %e, "reading a token stream failed");
                        return None;
                    }
                };
                if let Some(last) = events.last() {
                    let next = last.offset;
                    let text: String = events.iter().map(frame).collect();
                    let chunk = Ok::<_, std::io::Error>(text);
                    return Some((chunk, (shared, source, run, id, next, false)));
                }
                let done = match shared.store.find(id).await {
                    Ok(Some(r)) => r.status.is_terminal(),
                    Ok(None) | Err(_) => true,
                };
                if done {
                    return None;
                }
                tokio::time::sleep(POLL).await;
            }
        },
    );
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .map_err(|e| crate::error::DashboardError::BadRequest(e.to_string()))?)
}
