//! `GET /runs` with 100,000 runs in the store, through the router in process
//! (`tower::ServiceExt::oneshot`: routing, guard, the store's keyset page, HTML rendering):
//! the first page, a page deep in the list (90% down), and both filtered by status (10% of the
//! runs are failed). SQLite always; PostgreSQL too when `COURIER_TEST_POSTGRES_URL` is set.
//!
//! `cargo bench -p courier-dashboard --bench runs_page`
#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented items"
)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use courier_core::config::Config;
use courier_core::{MessageRegistry, TransportRegistry};
use courier_dashboard::{Dashboard, DashboardOptions};
use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
use criterion::{Criterion, criterion_group, criterion_main};
use tower::ServiceExt;

const RUNS: usize = 100_000;
const BASE: i64 = 1_750_000_000_000;
const CHUNK: usize = 500;

/// 100,000 runs, created one ms apart: 70% completed, 10% each failed, queued, cancelled; three
/// agents.
async fn fill(store: &SqlRunStore) {
    store.setup().await.expect("setup");
    let table = store.runs_table().to_owned();
    for start in (0..RUNS).step_by(CHUNK) {
        let rows: Vec<String> = (start..(start + CHUNK).min(RUNS))
            .map(|i| {
                let (status, reason) = match i % 10 {
                    7 => ("failed", "'retries_exhausted'"),
                    8 => ("queued", "NULL"),
                    9 => ("cancelled", "'cancelled'"),
                    _ => ("completed", "'completed'"),
                };
                let agent = ["summarize", "translate", "classify"][i % 3];
                let at = BASE + i64::try_from(i).expect("fits");
                format!(
                    "('{}', '{agent}', '{status}', '{{\"n\": {i}}}', {reason}, 0, 0, {at}, {at}, {at})",
                    uuid::Uuid::new_v4()
                )
            })
            .collect();
        store
            .execute(&format!(
                "INSERT INTO {table} (id, agent, status, input, termination_reason, lease_expires, \
                 requeue_count, created_at, updated_at, due_at) VALUES {}",
                rows.join(", ")
            ))
            .await
            .expect("insert runs");
    }
}

async fn router(store: SqlRunStore) -> Router {
    let config: Config = "[transports.async]\ndsn = \"in-memory://\"\n"
        .parse()
        .expect("config");
    let transports = config
        .connect(&TransportRegistry::new(), Arc::new(MessageRegistry::new()))
        .await
        .expect("transports");
    Dashboard::new(transports, Arc::new(store), DashboardOptions::default()).router()
}

async fn get(router: &Router, uri: &str) -> usize {
    let response = router
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK, "{uri}");
    axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .expect("body")
        .len()
}

fn bench_store(c: &mut Criterion, name: &str, dsn: &str, options: SqlRunStoreOptions) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (router, store) = rt.block_on(async {
        let store = SqlRunStore::connect(dsn, options).await.expect("connect");
        let _ = store.drop_tables().await;
        fill(&store).await;
        if store.dialect() == courier_runs::Dialect::Postgres {
            store
                .execute(&format!("ANALYZE {}", store.runs_table()))
                .await
                .expect("analyze");
        }
        (router(store.clone()).await, store)
    });
    // 90% down the newest-first list.
    let deep = format!("{}_ffffffff-ffff-ffff-ffff-ffffffffffff", BASE + 10_000);
    let pages = [
        ("first page", "/runs".to_owned()),
        ("deep page", format!("/runs?before={deep}")),
        ("failed, first page", "/runs?status=failed".to_owned()),
        (
            "failed, deep page",
            format!("/runs?status=failed&before={deep}"),
        ),
        (
            "agent, deep page",
            format!("/runs?agent=translate&before={deep}"),
        ),
    ];
    let mut group = c.benchmark_group(format!("runs_page/{name}"));
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (label, uri) in &pages {
        let bytes = rt.block_on(get(&router, uri));
        assert!(bytes > 10_000, "{label}: a page of 50 rows ({bytes} bytes)");
        group.bench_function(*label, |b| b.to_async(&rt).iter(|| get(&router, uri)));
    }
    group.finish();
    if !dsn.starts_with("sqlite") {
        rt.block_on(store.drop_tables()).expect("drop");
    }
}

fn runs_page(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let dsn = format!("sqlite://{}?mode=rwc", dir.path().join("runs.db").display());
    bench_store(c, "sqlite", &dsn, SqlRunStoreOptions::default());
    if let Ok(url) = std::env::var("COURIER_TEST_POSTGRES_URL") {
        let prefix = format!("bench_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        bench_store(
            c,
            "postgres",
            &url,
            SqlRunStoreOptions::default().table_prefix(&prefix),
        );
    }
}

criterion_group!(benches, runs_page);
criterion_main!(benches);
