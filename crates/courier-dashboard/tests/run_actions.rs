//! The run page's durable-steps parts through the router, in process: the step journal, the
//! budget and the pending wait; sending a waiting run its signal, resolving a parked step,
//! approving and giving input (each guarded by the CSRF token and a confirmation), against the
//! fixture's SQLite run store and a runtime running the scripted agent.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use courier_core::{InMemoryTransport, MessageBus};
use courier_dashboard::DashboardOptions;
use courier_runs::{
    Budget, NewRun, Outcome, ReapOptions, RunStatus, RunStore, Runtime, ScriptedAgent, StepStatus,
};
use serde_json::{Value, json};
use tower::ServiceExt;
use uuid::Uuid;

use common::Fixture;

async fn send(router: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = tokio::time::timeout(Duration::from_secs(20), router.clone().oneshot(request))
        .await
        .expect("request timed out")
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), 16 << 20)
        .await
        .unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

async fn get(router: &Router, uri: &str) -> (StatusCode, HeaderMap, String) {
    send(router, Request::get(uri).body(Body::empty()).unwrap()).await
}

async fn post(
    router: &Router,
    uri: &str,
    form: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let body = form
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let request = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .unwrap();
    send(router, request).await
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A runtime over the fixture's store running the scripted agent; its `RunAgent` messages are
/// kept in an in-memory queue (the test runs each run with `run_queued`).
fn runtime(fx: &Fixture) -> (Runtime, MessageBus, InMemoryTransport) {
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(fx.store.clone())
        .agent("scripted", ScriptedAgent)
        .worker_identity("worker:test")
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("runs", Arc::new(queue.clone()))
                .route("courier.run_agent", ["runs"]),
        )
        .build();
    (runtime, bus, queue)
}

async fn status(fx: &Fixture, id: Uuid) -> RunStatus {
    fx.store.find(id).await.unwrap().unwrap().status
}

/// Waits (at most 20 s) for the run to reach `want`.
async fn until(fx: &Fixture, id: Uuid, want: RunStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while status(fx, id).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {id} never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_run_page_shows_the_journal_budget_and_wait_and_sends_the_signal() {
    let fx = Fixture::new().await;
    let (runtime, _bus, queue) = runtime(&fx);
    let long = "y".repeat(300);
    let mut run = NewRun::new(
        "scripted",
        json!({"steps": [
            {"step": "fetch", "tokens_out": 60, "result": {"doc": long}},
            {"wait_signal": "approve", "timeout_ms": 3_600_000},
            {"step": "write"},
            {"output": "done"},
        ]}),
    );
    run.budget = Some(Budget::new().tokens_out(1_000).turns(10));
    let id = runtime.submit(run).await.unwrap();
    assert_eq!(runtime.run_queued(id).await.unwrap(), Outcome::Waiting);

    let dashboard = fx.dashboard(DashboardOptions::default().runtime(runtime.clone()));
    let csrf = dashboard.csrf_token().to_owned();
    let router = dashboard.router();
    let page_uri = format!("/runs/{id}");
    let (code, _, page) = get(&router, &page_uri).await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        page.contains(r#"<table id="steps">"#),
        "the journal: {page}"
    );
    assert!(
        page.contains("fetch") && page.contains("out 60, turns 1"),
        "{page}"
    );
    assert!(
        page.contains("tokens out 60 / 1000") && page.contains("turns 1 / 10"),
        "{page}"
    );
    assert!(
        page.contains("signal <code>approve</code>, wakes "),
        "{page}"
    );
    let table = page
        .split(r#"<table id="steps">"#)
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap();
    assert!(
        !table.contains(&long),
        "the result is cut to 200 characters"
    );
    assert!(
        // {"doc":" and 191 characters of the string: 200 with the ellipsis.
        table.contains(&format!(
            "{{&quot;doc&quot;:&quot;{}…</td>",
            "y".repeat(191)
        )),
        "{table}"
    );
    let signal_uri = format!("/runs/{id}/signal");
    assert!(
        page.contains(&format!(r#"action="{signal_uri}""#)),
        "{page}"
    );

    let (_, _, list) = get(&router, "/runs?status=waiting").await;
    assert!(
        list.contains(r#"<option value="waiting" selected>"#),
        "{list}"
    );
    assert!(list.contains(&id.to_string()), "{list}");
    let (code, _, api) = get(&router, &format!("/api/runs/{id}")).await;
    assert_eq!(code, StatusCode::OK);
    let api: Value = serde_json::from_str(&api).unwrap();
    assert_eq!(api["steps"].as_array().map(Vec::len), Some(2), "{api}");
    assert_eq!(api["steps"][0]["output"]["doc"], long.as_str());

    let form = |name: &'static str, data: &'static str, confirmed: &'static str| {
        vec![
            ("name", name),
            ("data", data),
            ("by", "ops"),
            ("confirmed", confirmed),
        ]
    };
    let (code, _, _) = post(&router, &signal_uri, &form("approve", "1", "1")).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "no csrf token");
    let with = |mut f: Vec<(&'static str, &'static str)>, csrf: &'static str| {
        f.push(("csrf", csrf));
        f
    };
    let csrf: &'static str = Box::leak(csrf.into_boxed_str());
    let (code, _, confirm) = post(
        &router,
        &signal_uri,
        &with(form("approve", "{\"ok\":true}", "0"), csrf),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        confirm.contains("Confirm")
            && confirm.contains(r#"name="data" value="{&quot;ok&quot;:true}""#),
        "{confirm}"
    );
    assert_eq!(
        status(&fx, id).await,
        RunStatus::Waiting,
        "not before the confirmation"
    );
    let (code, _, refused) =
        post(&router, &signal_uri, &with(form("reject", "1", "1"), csrf)).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(refused.contains("waits for `approve`"), "{refused}");
    let (code, _, bad) = post(
        &router,
        &signal_uri,
        &with(form("approve", "{nope", "1"), csrf),
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(bad.contains("data: invalid JSON"), "{bad}");
    assert_eq!(status(&fx, id).await, RunStatus::Waiting);

    let before = queue.sent().len();
    let (code, headers, _) = post(
        &router,
        &signal_uri,
        &with(form("approve", "{\"ok\":true}", "1"), csrf),
    )
    .await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    let location = headers[header::LOCATION].to_str().unwrap().to_owned();
    assert_eq!(location, format!("{page_uri}?done=signal-woken"));
    assert_eq!(status(&fx, id).await, RunStatus::Queued);
    assert_eq!(
        queue.sent().len(),
        before + 1,
        "the woken run is dispatched"
    );
    let (_, _, page) = get(&router, &location).await;
    assert!(page.contains("the run was woken and queued"), "{page}");
    runtime.run_queued(id).await.unwrap();
    let steps = fx.store.steps(id).await.unwrap();
    assert_eq!(steps.len(), 3);
    let received = steps[1].output.as_ref().unwrap();
    assert_eq!(received["received"]["data"], json!({"ok": true}));
    assert_eq!(received["received"]["by"], "ops");

    // Without a runtime: no actions, and a post is refused.
    let bare = fx.dashboard(DashboardOptions::default());
    let bare_csrf = bare.csrf_token().to_owned();
    let bare = bare.router();
    let waiting = runtime
        .enqueue("scripted", json!({"steps": [{"wait_signal": "go"}]}))
        .await
        .unwrap();
    runtime.run_queued(waiting).await.unwrap();
    let (_, _, page) = get(&bare, &format!("/runs/{waiting}")).await;
    assert!(page.contains("has no run runtime"), "{page}");
    assert!(!page.contains(&format!("/runs/{waiting}/signal")), "{page}");
    let (code, _, _) = post(
        &bare,
        &format!("/runs/{waiting}/signal"),
        &[("name", "go"), ("confirmed", "1"), ("csrf", &bare_csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(status(&fx, waiting).await, RunStatus::Waiting);
}

#[tokio::test]
async fn a_parked_step_is_resolved_and_approve_and_input_resume_the_run() {
    let fx = Fixture::new().await;
    let (runtime, _bus, queue) = runtime(&fx);
    let dashboard = fx.dashboard(DashboardOptions::default().runtime(runtime.clone()));
    let csrf = dashboard.csrf_token().to_owned();
    let router = dashboard.router();

    // A worker dies inside a guarded `park` step; the run resumed elsewhere parks.
    let script = json!({"steps": [
        {"step": "quote"},
        {"step": "pay", "effect": "guarded_park", "ms": 600_000},
        {"step": "receipt"},
        {"output": "done"},
    ]});
    let parked = runtime.enqueue("scripted", script).await.unwrap();
    let rt = runtime.clone();
    let task = tokio::spawn(async move { rt.run_queued(parked).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while fx
        .store
        .steps(parked)
        .await
        .unwrap()
        .get(1)
        .map(|s| s.status)
        != Some(StepStatus::Intent)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the guarded step never began"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    let _ = task.await;
    fx.store
        .execute(&format!(
            "UPDATE {} SET lease_expires = 1 WHERE id = '{parked}'",
            fx.store.runs_table()
        ))
        .await
        .unwrap();
    let reaped = runtime.reaper().reap(ReapOptions::default()).await.unwrap();
    assert_eq!(reaped.requeued, 1, "{reaped:?}");
    assert_eq!(
        runtime.run_queued(parked).await.unwrap(),
        Outcome::AwaitingApproval
    );

    let (_, _, page) = get(&router, &format!("/runs/{parked}")).await;
    assert!(page.contains("step 2: pay"), "{page}");
    for action in ["retry", "skip", "fail"] {
        assert!(
            page.contains(&format!(r#"data-action="{action}""#)),
            "{action}: {page}"
        );
    }
    assert!(
        !page.contains(r#"data-action="approve""#),
        "a parked step is resolved, not approved"
    );
    let approve = |id: Uuid| format!("/runs/{id}/approve");
    let (code, _, refused) = post(
        &router,
        &approve(parked),
        &[("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(refused.contains("parked on step 2: pay"), "{refused}");
    let resolve = format!("/runs/{parked}/resolve");
    let (code, _, _) = post(&router, &resolve, &[("action", "skip"), ("confirmed", "1")]).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "no csrf token");
    let (code, _, _) = post(
        &router,
        &resolve,
        &[("action", "later"), ("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    let (code, _, confirm) = post(
        &router,
        &resolve,
        &[
            ("action", "skip"),
            ("result", r#"{"paid":true}"#),
            ("confirmed", "0"),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert!(confirm.contains("Confirm"), "{confirm}");
    assert_eq!(status(&fx, parked).await, RunStatus::WaitingForApproval);
    let before = queue.sent().len();
    let (code, headers, _) = post(
        &router,
        &resolve,
        &[
            ("action", "skip"),
            ("result", r#"{"paid":true}"#),
            ("confirmed", "1"),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    assert!(
        headers[header::LOCATION]
            .to_str()
            .unwrap()
            .ends_with("?done=skip")
    );
    assert_eq!(
        queue.sent().len(),
        before + 1,
        "the released run is dispatched"
    );
    assert_eq!(
        runtime.run_queued(parked).await.unwrap(),
        Outcome::Completed {
            output: json!("done")
        }
    );
    let steps = fx.store.steps(parked).await.unwrap();
    assert_eq!(steps[1].output, Some(json!({"paid": true})));
    let (code, _, again) = post(
        &router,
        &resolve,
        &[("action", "retry"), ("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert!(again.contains("is completed"), "{again}");

    // Approve: the run resumes in the dashboard's process.
    let approval = runtime
        .enqueue(
            "scripted",
            json!({"steps": [{"await_approval": true}, {"output": "approved"}]}),
        )
        .await
        .unwrap();
    runtime.run_queued(approval).await.unwrap();
    let (_, _, page) = get(&router, &format!("/runs/{approval}")).await;
    assert!(page.contains(r#"data-action="approve""#), "{page}");
    let (code, headers, _) = post(
        &router,
        &approve(approval),
        &[("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    assert!(
        headers[header::LOCATION]
            .to_str()
            .unwrap()
            .ends_with("?done=approved")
    );
    until(&fx, approval, RunStatus::Completed).await;
    let (code, _, _) = post(
        &router,
        &approve(approval),
        &[("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        code,
        StatusCode::CONFLICT,
        "a completed run is not approved"
    );

    // Input.
    let asking = runtime
        .enqueue(
            "scripted",
            json!({"steps": [{"await_input": "name?"}, {"output": "hi"}]}),
        )
        .await
        .unwrap();
    runtime.run_queued(asking).await.unwrap();
    let input = format!("/runs/{asking}/input");
    let (_, _, page) = get(&router, &format!("/runs/{asking}")).await;
    assert!(page.contains(&format!(r#"action="{input}""#)), "{page}");
    let (code, _, empty) = post(
        &router,
        &input,
        &[("data", " "), ("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(empty.contains("data: give a JSON value"), "{empty}");
    let (code, _, _) = post(
        &router,
        &input,
        &[("data", r#""Ada""#), ("confirmed", "1"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(code, StatusCode::SEE_OTHER);
    until(&fx, asking, RunStatus::Completed).await;
    let events = fx.store.events(asking).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "input" && e.payload == json!("Ada")),
        "{events:?}"
    );
}
