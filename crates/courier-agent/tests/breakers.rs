//! Circuit breakers shared through the run store's database: two independent handles on one
//! SQLite file (two workers) see one breaker per provider; it opens after N failures, one of
//! them probes once it is due, and the probe's success closes it. Calls are counted by the
//! HTTP server itself.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use courier_agent::breaker::{BreakerPolicy, BreakerStore, Permit, State};
use courier_agent::{LlmAgent, Provider, SqlBreakers};
use courier_runs::{MemoryRunStore, Outcome};
use serde_json::json;
use support::{Reply, Server, answer, runtime};

fn policy(cooldown: Duration) -> BreakerPolicy {
    BreakerPolicy {
        failures: 2,
        window: Duration::from_secs(600),
        cooldown,
        probe_timeout: Duration::from_secs(600),
    }
}

async fn ask(server: &Server, breakers: &SqlBreakers, policy: BreakerPolicy) -> String {
    let agent = LlmAgent::builder()
        .provider(Provider::new("p1", server.base_url("p1"), "m1").timeout(Duration::from_secs(5)))
        .provider(Provider::new("p2", server.base_url("p2"), "m2").timeout(Duration::from_secs(5)))
        .breakers(Arc::new(breakers.clone()), policy)
        .build()
        .unwrap();
    let (rt, _bus) = runtime(Arc::new(MemoryRunStore::new()), "worker:x", agent);
    match rt.run("llm", json!("hi")).await.unwrap().1 {
        Outcome::Completed { output } => output["answer"].as_str().unwrap().to_owned(),
        other => panic!("{other:?}"),
    }
}

async fn state_of(breakers: &SqlBreakers, provider: &str) -> Option<State> {
    breakers
        .rows()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.provider == provider)
        .map(|r| r.state)
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_breaker_opens_half_opens_for_one_worker_and_closes_across_two_store_handles() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("sqlite://{}?mode=rwc", dir.path().join("runs.db").display());
    shared_breaker_cycle(&dsn, None).await;
}

/// The same on PostgreSQL: two handles, each with its own pool (two workers), on one table.
#[cfg(feature = "postgres")]
#[tokio::test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn a_postgres_breaker_opens_half_opens_for_one_worker_and_closes_across_two_pools() {
    let cleanup = courier_test::Cleanup::new();
    let table = cleanup.postgres_table("agent_breakers");
    let url = courier_test::env::postgres_url();
    shared_breaker_cycle(&url, Some(&table)).await;
}

/// Two independent handles on the breakers of `dsn` (table `table`): opens after two failures,
/// the other handle skips the provider, one of two racing handles probes, a dead prober is
/// replaced, a real probe closes it.
async fn shared_breaker_cycle(dsn: &str, table: Option<&str>) {
    let server = Server::start().await;
    let a = SqlBreakers::connect(dsn, table).await.unwrap();
    let b = SqlBreakers::connect(dsn, table).await.unwrap();
    let closed_for_long = policy(Duration::from_secs(3600));

    // Worker A: p1 fails twice (503, then 502), p2 answers.
    server.script(
        "p1",
        [Reply::Status(503, vec![]), Reply::Status(502, vec![])],
    );
    server.script(
        "p2",
        [
            Reply::Json(answer("p2 #1", 1, 1)),
            Reply::Json(answer("p2 #2", 1, 1)),
        ],
    );
    assert_eq!(ask(&server, &a, closed_for_long).await, "p2 #1");
    assert_eq!(
        state_of(&b, "p1").await,
        Some(State::Closed),
        "one failure of two"
    );
    assert_eq!(ask(&server, &a, closed_for_long).await, "p2 #2");
    assert_eq!(
        state_of(&b, "p1").await,
        Some(State::Open),
        "worker B's handle sees it open"
    );

    // Worker B skips p1 without calling it.
    server.script("p2", [Reply::Json(answer("p2 #3", 1, 1))]);
    assert_eq!(ask(&server, &b, closed_for_long).await, "p2 #3");
    assert_eq!(
        server.calls_to("p1"),
        2,
        "the open breaker kept worker B off p1"
    );

    // Due: the two workers race for the probe; exactly one gets it. Its probe fails: open
    // again.
    let due = policy(Duration::ZERO);
    let now = now_ms();
    let (pa, pb) = tokio::join!(a.acquire("p1", &due, now), b.acquire("p1", &due, now));
    let mut permits = [pa.unwrap(), pb.unwrap()];
    permits.sort_by_key(|p| *p == Permit::Probe);
    assert_eq!(permits, [Permit::Open, Permit::Probe], "one prober");
    assert_eq!(state_of(&a, "p1").await, Some(State::HalfOpen));
    b.failure("p1", &due, now).await.unwrap();
    assert_eq!(state_of(&a, "p1").await, Some(State::Open));

    // A prober that dies without a word is replaced once its probe time is over.
    let t0 = 1_000_000;
    a.failure("p9", &due, t0).await.unwrap();
    a.failure("p9", &due, t0).await.unwrap();
    assert_eq!(a.acquire("p9", &due, t0).await.unwrap(), Permit::Probe);
    assert_eq!(
        b.acquire("p9", &due, t0 + 599_999).await.unwrap(),
        Permit::Open
    );
    assert_eq!(
        b.acquire("p9", &due, t0 + 600_000).await.unwrap(),
        Permit::Probe,
        "a dead prober is replaced"
    );

    // Worker B's agent, with the breaker due, probes p1 for real: it answers, the breaker closes.
    server.script("p1", [Reply::Json(answer("p1 is back", 1, 1))]);
    assert_eq!(ask(&server, &b, due).await, "p1 is back");
    assert_eq!(server.calls_to("p1"), 3);
    assert_eq!(
        state_of(&a, "p1").await,
        Some(State::Closed),
        "closed for every worker"
    );
    assert_eq!(server.calls_to("p2"), 3);
}
