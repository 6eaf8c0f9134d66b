//! The dashboard through its router, in process (no browser): pages, escaping, the guard
//! (token, hosts, CSRF, confirmation), the retry, and the JSON API's shapes.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use courier_core::{TransportError, WorkerRecord, WorkerRegistry, async_trait};
use courier_dashboard::DashboardOptions;
use tower::ServiceExt;

use common::{Fixture, SCRIPT_TEXT};

async fn send(router: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        router.clone().oneshot(request),
    )
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

async fn post(router: &Router, uri: &str, form: &str) -> (StatusCode, HeaderMap, String) {
    let request = Request::post(uri)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap();
    send(router, request).await
}

async fn failed_ids(fx: &Fixture) -> Vec<String> {
    let list = fx.transports.get("failed").unwrap().as_listable().unwrap();
    list.list(100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.id().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn pages_show_the_seeded_runs_timeline_and_transports() {
    let fx = Fixture::new().await;
    let router = fx.dashboard(DashboardOptions::default()).router();
    let (status, headers, overview) = get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        overview.contains("Transports") && overview.contains("async"),
        "{overview}"
    );
    assert!(overview.contains("failure transport"));
    let csp = headers
        .get(header::CONTENT_SECURITY_POLICY)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");

    let (status, _, runs) = get(&router, "/runs").await;
    assert_eq!(status, StatusCode::OK);
    for id in &fx.seeded.runs {
        assert!(runs.contains(&id.to_string()), "run {id} listed");
    }
    let (_, _, failed_only) = get(&router, "/runs?status=failed").await;
    assert!(failed_only.contains(&fx.seeded.failed_run.to_string()));
    assert!(!failed_only.contains(&fx.seeded.running.to_string()));

    let running = fx.seeded.running;
    let (status, headers, _) = get(&router, &format!("/runs?id={running}")).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "find by id redirects");
    assert_eq!(
        headers[header::LOCATION],
        format!("/runs/{running}").as_str()
    );
    let (status, _, detail) = get(&router, &format!("/runs/{running}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        detail.contains("last heartbeat by worker:build-7:4242:a1b2c3"),
        "{detail}"
    );
    assert!(detail.contains("#1 fetch") && detail.contains("#2 llm_call"));
    assert!(detail.contains("lease expires"));
    let (status, _, _) = get(&router, &format!("/runs/{}", uuid::Uuid::new_v4())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get(&router, "/runs?status=bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_script_in_a_body_or_an_error_is_shown_as_text() {
    let fx = Fixture::new().await;
    let router = fx.dashboard(DashboardOptions::default()).router();
    let id = &fx.seeded.script_message;
    let (status, _, page) = get(&router, &format!("/failed/failed/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("&lt;script&gt;window.__pwned = 1&lt;/script&gt; hello"),
        "{page}"
    );
    assert!(!page.contains(SCRIPT_TEXT));
    assert!(!page.contains("<b>bad</b>") && page.contains("&lt;b&gt;bad&lt;/b&gt;"));
    let (_, _, list) = get(&router, "/failed").await;
    assert!(!list.contains("<b>bad</b>") && list.contains("&lt;b&gt;bad&lt;/b&gt;"));
}

#[tokio::test]
async fn a_post_needs_the_csrf_token_and_a_confirmation() {
    let fx = Fixture::new().await;
    let dashboard = fx.dashboard(DashboardOptions::default());
    let csrf = dashboard.csrf_token().to_owned();
    let router = dashboard.router();
    let (id, _) = fx.seeded.messages[0].clone();
    let form = format!("transport=failed&id={id}");
    let (status, _, _) = post(&router, "/failed/remove", &format!("{form}&confirmed=1")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no csrf token");
    let (status, _, _) = post(
        &router,
        "/failed/remove",
        &format!("{form}&confirmed=1&csrf=nope"),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "wrong csrf token");
    let (status, _, page) = post(
        &router,
        "/failed/remove",
        &format!("{form}&confirmed=0&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Confirm"), "a confirmation page: {page}");
    assert!(failed_ids(&fx).await.contains(&id), "nothing removed yet");
    let (status, headers, _) = post(
        &router,
        "/failed/remove",
        &format!("{form}&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        headers[header::LOCATION]
            .to_str()
            .unwrap()
            .contains("done=removed&n=1")
    );
    assert!(!failed_ids(&fx).await.contains(&id), "removed");
    let (status, _, _) = get(&router, "/failed/remove").await;
    assert_eq!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "GET changes nothing"
    );
}

#[tokio::test]
async fn a_retry_sends_the_message_back_to_the_transport_it_failed_on() {
    let fx = Fixture::new().await;
    let dashboard = fx.dashboard(DashboardOptions::default());
    let csrf = dashboard.csrf_token().to_owned();
    let router = dashboard.router();
    let (id, text) = fx.seeded.messages[1].clone();
    let (status, _, _) = post(
        &router,
        "/failed/retry",
        &format!("transport=failed&id={id}&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(!failed_ids(&fx).await.contains(&id));
    let back = fx.transports.get("async").unwrap().get(10).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].message::<common::Note>().unwrap().text, text);
    assert!(!back[0].has::<courier_core::SentToFailureTransportStamp>());
    // All of them.
    let (status, headers, _) = post(
        &router,
        "/failed/retry",
        &format!("transport=failed&all=1&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(headers[header::LOCATION].to_str().unwrap().contains("n=3"));
    assert!(failed_ids(&fx).await.is_empty());
}

/// Pause and Resume set and clear the same flag `courier pause|resume` does (the transport's
/// `Pausable` store), after the CSRF token and a confirmation, and the overview shows it.
#[tokio::test]
async fn pause_and_resume_buttons_set_and_clear_the_queue_flag() {
    let fx = Fixture::new().await;
    let dashboard = fx.dashboard(DashboardOptions::default());
    let csrf = dashboard.csrf_token().to_owned();
    let router = dashboard.router();
    let flag = || async {
        let t = fx.transports.get("async").unwrap();
        t.as_pausable().unwrap().is_paused().await.unwrap()
    };
    let (_, _, overview) = get(&router, "/").await;
    assert!(
        overview.contains(r#"action="/transports/pause""#) && overview.contains("running"),
        "a Pause button per queue: {overview}"
    );
    let (status, _, _) = post(&router, "/transports/pause", "transport=async&confirmed=1").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no csrf token");
    let (status, _, page) = post(
        &router,
        "/transports/pause",
        &format!("transport=async&confirmed=0&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("Confirm"), "{page}");
    assert!(!flag().await, "not paused before the confirmation");
    let (status, headers, _) = post(
        &router,
        "/transports/pause",
        &format!("transport=async&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(flag().await, "paused in the transport's store");
    let (_, _, overview) = get(&router, &location).await;
    assert!(overview.contains("Transport `async` paused."), "{overview}");
    assert!(
        overview.contains(r#"action="/transports/resume""#),
        "{overview}"
    );
    let (status, _, _) = post(
        &router,
        "/transports/resume",
        &format!("transport=async&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(!flag().await, "resumed: the flag is cleared");
    let (status, _, _) = post(
        &router,
        "/transports/pause",
        &format!("transport=nowhere&confirmed=1&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = get(&router, "/transports/pause").await;
    assert_eq!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "GET changes nothing"
    );
}

#[tokio::test]
async fn a_token_is_required_on_every_request_when_set() {
    let fx = Fixture::new().await;
    let router = fx
        .dashboard(DashboardOptions::default().token("s3cret-token"))
        .router();
    let (status, _, _) = get(&router, "/").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = get(&router, "/api/stats").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let bearer = Request::get("/api/stats")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, bearer).await.0, StatusCode::OK);
    let wrong = Request::get("/")
        .header(header::AUTHORIZATION, "Bearer s3cret-tokex")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, wrong).await.0, StatusCode::UNAUTHORIZED);
    let (status, headers, _) = get(&router, "/runs?status=failed&token=s3cret-token").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "login");
    assert_eq!(headers[header::LOCATION], "/runs?status=failed");
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let with_cookie = Request::get("/runs?status=failed")
        .header(header::COOKIE, cookie.split(';').next().unwrap())
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, with_cookie).await.0, StatusCode::OK);
    let (status, _, _) = get(&router, "/?token=guess").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn only_loopback_host_names_are_served_without_a_token() {
    let fx = Fixture::new().await;
    let router = fx
        .dashboard(DashboardOptions::default().loopback_hosts(8080))
        .router();
    let with_host = |host: &str| {
        Request::get("/")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        send(&router, with_host("127.0.0.1:8080")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&router, with_host("localhost:8080")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&router, with_host("attacker.example:8080")).await.0,
        StatusCode::FORBIDDEN,
        "a rebound name is refused"
    );
    assert_eq!(get(&router, "/").await.0, StatusCode::FORBIDDEN, "no Host");
}

#[tokio::test]
async fn the_api_answers_in_the_cli_json_shapes() {
    let fx = Fixture::new().await;
    let router = fx.dashboard(DashboardOptions::default()).router();
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();

    let (status, headers, body) = get(&router, "/api/runs?limit=4").await;
    assert_eq!(status, StatusCode::OK);
    let first = json(&body);
    let first = first.as_array().unwrap();
    assert_eq!(first.len(), 4);
    for key in [
        "id",
        "agent",
        "status",
        "termination_reason",
        "requeue_count",
        "claimed_by",
        "lease_expires",
        "error_class",
        "output",
        "created_at",
        "started_at",
        "finished_at",
    ] {
        assert!(first[0].get(key).is_some(), "runs list has `{key}`");
    }
    let next = headers["x-next-cursor"].to_str().unwrap();
    let (_, _, body) = get(&router, &format!("/api/runs?limit=100&before={next}")).await;
    let rest = json(&body);
    assert_eq!(
        first.len() + rest.as_array().unwrap().len(),
        fx.seeded.runs.len()
    );

    let id = fx.seeded.failed_run;
    let (_, _, body) = get(&router, &format!("/api/runs/{id}")).await;
    let run = json(&body);
    assert_eq!(run["status"], "failed");
    assert_eq!(run["termination_reason"], "retries_exhausted");
    assert_eq!(run["error_class"], "server_error");
    assert_eq!(run["events"].as_array().unwrap().len(), 2);
    let (_, _, body) = get(&router, &format!("/api/runs/{id}/events")).await;
    let events = json(&body);
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events[1]["kind"], "error");
    assert!(events[0]["created_at"].as_str().unwrap().ends_with('Z'));

    let (_, _, body) = get(&router, "/api/failed").await;
    let failed = json(&body);
    let failed = failed.as_array().unwrap();
    assert_eq!(failed.len(), 4);
    for key in [
        "id",
        "type",
        "transport",
        "error_class",
        "error",
        "retry_count",
        "failed_at",
    ] {
        assert!(failed[0].get(key).is_some(), "failed has `{key}`");
    }
    assert_eq!(failed[0]["type"], "app.note");
    assert_eq!(failed[0]["transport"], "async");
    assert_eq!(failed[0]["retry_count"], 3);

    let (_, _, body) = get(&router, "/api/stats").await;
    assert_eq!(json(&body), serde_json::json!({ "async": 0, "failed": 4 }));

    // SQLite transports keep a worker registry: nobody has registered yet.
    let (status, _, body) = get(&router, "/api/workers").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body), serde_json::json!([]));
    let (status, _, body) = get(&router, "/api/runs/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        json(&body)["error"]
            .as_str()
            .unwrap()
            .contains("not a run id")
    );
}

/// A registry holding fixed records.
#[derive(Default)]
struct FixedRegistry(Mutex<Vec<WorkerRecord>>);

#[async_trait]
impl WorkerRegistry for FixedRegistry {
    async fn register(&self, worker: &WorkerRecord) -> Result<(), TransportError> {
        self.0.lock().unwrap().push(worker.clone());
        Ok(())
    }
    async fn heartbeat(
        &self,
        _worker: &WorkerRecord,
    ) -> Result<courier_core::Heartbeat, TransportError> {
        Ok(courier_core::Heartbeat::default())
    }
    async fn unregister(&self, id: &str) -> Result<(), TransportError> {
        self.0.lock().unwrap().retain(|w| w.id != id);
        Ok(())
    }
    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        Ok(self.0.lock().unwrap().clone())
    }
    async fn request_stop(&self, _id: Option<&str>) -> Result<u64, TransportError> {
        Ok(0)
    }
}

#[tokio::test]
async fn the_workers_page_lists_the_registry_or_says_there_is_none() {
    // The SQL transports' own registry.
    let fx = Fixture::new().await;
    let router = fx.dashboard(DashboardOptions::default()).router();
    let (_, _, page) = get(&router, "/workers").await;
    assert!(page.contains("No worker is alive."), "{page}");
    let sql_registry = fx
        .transports
        .get("async")
        .unwrap()
        .as_worker_registry()
        .expect("SQL transports keep a registry");
    let mut w = WorkerRecord::new("worker:host-a:311:x1", "host-a", 311, vec!["async".into()]);
    w.handled = 1234;
    sql_registry.register(&w).await.unwrap();
    let (_, _, page) = get(&router, "/workers").await;
    assert!(
        page.contains("worker:host-a:311:x1") && page.contains("1234"),
        "{page}"
    );
    let (_, _, body) = get(&router, "/api/workers").await;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list[0]["id"], "worker:host-a:311:x1");
    assert_eq!(list[0]["handled"], 1234);

    // One given in the options.
    let registry = Arc::new(FixedRegistry::default());
    registry.register(&w).await.unwrap();
    registry
        .register(&WorkerRecord::new(
            "worker:host-b:7:y2",
            "host-b",
            7,
            vec!["async".into()],
        ))
        .await
        .unwrap();
    let router = fx
        .dashboard(DashboardOptions::default().worker_registry(registry))
        .router();
    let (status, _, page) = get(&router, "/workers").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("worker:host-a:311:x1") && page.contains("worker:host-b:7:y2"));
    let (_, _, overview) = get(&router, "/").await;
    assert!(overview.contains("Workers alive"));
    let (_, _, body) = get(&router, "/api/workers").await;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);

    // In-memory transports keep none.
    let config: courier_core::config::Config = "[transports.async]\ndsn = \"in-memory://\"\n"
        .parse()
        .unwrap();
    let transports = config
        .connect(
            &courier_core::TransportRegistry::new(),
            Arc::new(common::registry()),
        )
        .await
        .unwrap();
    let store = Arc::new(courier_runs::MemoryRunStore::new());
    let router =
        courier_dashboard::Dashboard::new(transports, store, DashboardOptions::default()).router();
    let (_, _, page) = get(&router, "/workers").await;
    assert!(
        page.contains("no worker registry in this configuration"),
        "{page}"
    );
    let (status, _, body) = get(&router, "/api/workers").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"], "no worker registry in this configuration");
}

/// Fixed breakers, or a failure.
struct FixedBreakers(Result<Vec<courier_dashboard::BreakerView>, String>);

#[async_trait]
impl courier_dashboard::BreakerSource for FixedBreakers {
    async fn breakers(&self) -> Result<Vec<courier_dashboard::BreakerView>, String> {
        self.0.clone()
    }
}

#[tokio::test]
async fn the_workers_page_shows_the_agents_circuit_breakers_when_given() {
    let fx = Fixture::new().await;
    let router = fx.dashboard(DashboardOptions::default()).router();
    let (_, _, page) = get(&router, "/workers").await;
    assert!(!page.contains("Circuit breakers"), "none given: {page}");

    let view =
        |provider: &str, state: &str, failures, opened_at_ms| courier_dashboard::BreakerView {
            provider: provider.into(),
            state: state.into(),
            failures,
            opened_at_ms,
        };
    let source = FixedBreakers(Ok(vec![
        view("fallback", "closed", 0, 0),
        view("primary", "open", 3, 1_796_421_604_863),
    ]));
    let router = fx
        .dashboard(DashboardOptions::default().breakers(Arc::new(source)))
        .router();
    let (status, _, page) = get(&router, "/workers").await;
    assert_eq!(status, StatusCode::OK);
    let table = &page[page.find("id=\"breakers\"").expect("a breakers table")..];
    let primary = &table[table.find("primary").expect("primary")..];
    let row = &primary[..primary.find("</tr>").expect("row end")];
    assert!(
        row.contains(">open<") && row.contains(">3<") && row.contains("2026-12-04"),
        "{row}"
    );
    assert!(
        table.contains("fallback") && table.contains(">never<"),
        "{table}"
    );

    let router = fx
        .dashboard(
            DashboardOptions::default().breakers(Arc::new(FixedBreakers(Err("store down".into())))),
        )
        .router();
    let (status, _, page) = get(&router, "/workers").await;
    assert_eq!(status, StatusCode::OK, "the workers are still shown");
    assert!(
        page.contains("The breakers cannot be read: store down"),
        "{page}"
    );
}

/// A keyed queue's concurrency keys: the overview's table (in flight of the most allowed, and
/// queued) and `/api/keys` in the shape of `courier stats --keys --format json`. Without a
/// keyed queue the section is left out.
#[tokio::test]
async fn the_overview_and_the_api_show_a_keyed_queues_keys() {
    use courier_core::config::Config;
    use courier_core::{ConcurrencyKeyStamp, Envelope, TransportRegistry};

    let fx = Fixture::new().await;
    let (_, _, plain) = get(&fx.dashboard(DashboardOptions::default()).router(), "/").await;
    assert!(!plain.contains("Concurrency keys"), "no keyed queue");

    let db = fx.dir.path().join("keyed.db");
    let config: Config = format!(
        "[transports.jobs]\ndsn = \"sqlite://{}?concurrency_max=2\"\n",
        db.display()
    )
    .parse()
    .unwrap();
    let factories = TransportRegistry::new().with(Arc::new(courier_sql::SqlTransportFactory));
    let transports = config
        .connect(&factories, Arc::new(common::registry()))
        .await
        .unwrap();
    let jobs = transports.get("jobs").unwrap().clone();
    jobs.as_setup().unwrap().setup().await.unwrap();
    let note = |key: &str| {
        Envelope::new(common::Note {
            text: "x".to_owned(),
        })
        .with(ConcurrencyKeyStamp::new(key).unwrap())
    };
    let mut batch: Vec<Envelope> = (0..3).map(|_| note("tenant-1")).collect();
    batch.push(note("<b>tenant-2</b>"));
    jobs.send_batch(batch).await.unwrap();
    let got = jobs.get(10).await.unwrap();
    assert_eq!(got.len(), 3, "two of tenant-1 (max 2), one of tenant-2");

    let dashboard = courier_dashboard::Dashboard::new(
        transports,
        fx.store.clone(),
        DashboardOptions::default(),
    );
    let router = dashboard.router();
    let (status, _, overview) = get(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(overview.contains("Concurrency keys"), "{overview}");
    let row = overview
        .split("<tr data-key=\"tenant-1\">")
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("no row for tenant-1: {overview}"));
    assert!(row.contains("2 / 2") && row.contains(">1<"), "{row}");
    assert!(
        overview.contains("&lt;b&gt;tenant-2&lt;/b&gt;") && !overview.contains("<b>tenant-2"),
        "a key is shown as text"
    );
    let (status, _, body) = get(&router, "/api/keys").await;
    assert_eq!(status, StatusCode::OK);
    let keys: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        keys,
        serde_json::json!({ "jobs": {
            "max": 2,
            "keys": [
                { "key": "tenant-1", "in_flight": 2, "queued": 1 },
                { "key": "<b>tenant-2</b>", "in_flight": 1, "queued": 0 },
            ],
            "other": null,
            "other_keys": 0,
        }})
    );
}
