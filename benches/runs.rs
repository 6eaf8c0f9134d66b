//! Durable runs: step throughput with the heartbeat on (worker run: renew at every boundary) vs
//! off (interactive run), and the reaper's stale scan over 100,000 runs of which 100 are stale,
//! with the query plan. SQLite always (a temp file); PostgreSQL when `COURIER_TEST_POSTGRES_URL`
//! is set and courier-runs is built with its `postgres` feature.
//!
//! `cargo bench --bench runs --features runs` (set `RUNS_BENCH_STEPS` to change the 2,000 steps).

use std::sync::Arc;
use std::time::Instant;

use courier_core::{InMemoryTransport, MessageBus};
use courier_runs::{
    Agent, AgentError, AgentOutcome, Dialect, Outcome, ReapOptions, RunContext, RunStore, Runtime,
    SqlRunStore, SqlRunStoreOptions, Step,
};

/// Checkpoints `n` empty steps.
struct Noop(usize);

#[courier_runs::async_trait]
impl Agent for Noop {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        for _ in 0..self.0 {
            cx.checkpoint(Step::new("noop", Default::default())).await?;
        }
        Ok(AgentOutcome::Completed(Default::default()))
    }
}

async fn steps_per_second(store: Arc<dyn RunStore>, steps: usize) -> (f64, f64) {
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(store.clone())
        .agent("noop", Noop(steps))
        .build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("q", Arc::new(queue.clone()))
                .route("courier.run_agent", ["q"]),
        )
        .build();
    // heartbeat off: an interactive run (no lease, no renew)
    let started = Instant::now();
    let (_, outcome) = runtime
        .run("noop", Default::default())
        .await
        .expect("interactive run");
    assert!(matches!(outcome, Outcome::Completed { .. }));
    let off = steps as f64 / started.elapsed().as_secs_f64();
    // heartbeat on: a worker run (claim, then renew at every boundary)
    let id = runtime
        .enqueue("noop", Default::default())
        .await
        .expect("enqueue");
    let started = Instant::now();
    let outcome = runtime.run_queued(id).await.expect("worker run");
    assert!(matches!(outcome, Outcome::Completed { .. }));
    let on = steps as f64 / started.elapsed().as_secs_f64();
    (on, off)
}

const SEED_SQLITE: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) \
    INSERT INTO {runs} (id, agent, status, input, lease_expires, requeue_count, created_at, updated_at) \
    SELECT printf('%08x-0000-4000-8000-%012x', i, i), 'noop', \
    CASE WHEN i <= 1100 THEN 'running' ELSE 'completed' END, 'null', \
    CASE WHEN i <= 100 THEN {now} - 60000 WHEN i <= 1100 THEN {now} + 900000 ELSE 0 END, 0, {now}, {now} FROM n";

const SEED_POSTGRES: &str = "INSERT INTO {runs} (id, agent, status, input, lease_expires, requeue_count, created_at, updated_at) \
    SELECT lpad(to_hex(i), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(i), 12, '0'), 'noop', \
    CASE WHEN i <= 1100 THEN 'running' ELSE 'completed' END, 'null', \
    CASE WHEN i <= 100 THEN {now} - 60000 WHEN i <= 1100 THEN {now} + 900000 ELSE 0 END, 0, {now}, {now} \
    FROM generate_series(1, 100000) AS i";

async fn reaper_scan(store: &SqlRunStore) {
    let seed = match store.dialect() {
        Dialect::Sqlite => SEED_SQLITE,
        _ => SEED_POSTGRES,
    }
    .replace("{runs}", store.runs_table())
    .replace("{now}", store.dialect().now_ms_sql());
    let started = Instant::now();
    store.execute(&seed).await.expect("seed 100,000 runs");
    let _ = store
        .execute(&format!("ANALYZE {}", store.runs_table()))
        .await;
    println!(
        "  seeded 100,000 runs (100 stale) in {:?}",
        started.elapsed()
    );
    for line in store.explain_stale(50).await.expect("explain") {
        println!("  plan: {line}");
    }
    let mut times = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let stale = store.select_stale(50).await.expect("select");
        times.push(started.elapsed());
        assert_eq!(stale.len(), 50);
    }
    times.sort();
    println!(
        "  stale select (limit 50) over 100,000 runs: median {:?}, max {:?}",
        times[10], times[20]
    );
    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(Arc::new(store.clone())).build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("q", Arc::new(queue.clone()))
                .route("courier.run_agent", ["q"]),
        )
        .build();
    let started = Instant::now();
    let report = runtime
        .reaper()
        .reap(ReapOptions {
            limit: 100,
            dry_run: false,
        })
        .await
        .expect("reap");
    println!(
        "  full reap of the 100 stale runs: {:?} ({report})",
        started.elapsed()
    );
}

async fn bench(name: &str, dsn: &str, steps: usize) {
    let prefix = format!("bench_{}", std::process::id());
    let store = match SqlRunStore::connect(dsn, SqlRunStoreOptions::default().table_prefix(&prefix))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            println!("{name}: skipped ({e})");
            return;
        }
    };
    store.setup().await.expect("setup");
    println!("{name}:");
    let (on, off) = steps_per_second(Arc::new(store.clone()), steps).await;
    println!(
        "  {steps} no-op steps: heartbeat on {on:.0} steps/s, off {off:.0} steps/s, on/off = {:.2}",
        on / off
    );
    reaper_scan(&store).await;
    store.drop_tables().await.expect("drop");
}

fn main() {
    let steps = std::env::var("RUNS_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = std::env::temp_dir().join(format!("courier-runs-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        bench(
            "sqlite",
            &format!("sqlite://{}", dir.join("runs.db").display()),
            steps,
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
        match std::env::var("COURIER_TEST_POSTGRES_URL") {
            Ok(url) => bench("postgres", &url, steps).await,
            Err(_) => println!("postgres: skipped (set COURIER_TEST_POSTGRES_URL)"),
        }
    });
}
