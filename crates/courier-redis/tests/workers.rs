//! The worker registry in `<group>:workers` on a real Redis: records shared between
//! connections, heartbeats carrying counts and the stop flag, stale records pruned, server times.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::RedisHarness;
use courier_core::{Heartbeat, Transport, WorkerRecord, WorkerRegistry};

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("redis answered within 10 s")
}

fn record(id: &str) -> WorkerRecord {
    WorkerRecord::new(id, "host-a", 42, vec!["async".into()])
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

/// Deletes the registry's keys when dropped.
struct Keys {
    url: String,
    group: String,
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(self.url.as_str())
            && let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(5))
        {
            let _: Result<(), _> = redis::cmd("DEL")
                .arg(format!("{}:workers", self.group))
                .arg(format!("{}:workers:stop", self.group))
                .query(&mut conn);
        }
    }
}

async fn two(
    h: &RedisHarness,
    extra: &str,
) -> (
    std::sync::Arc<courier_redis::RedisTransport>,
    std::sync::Arc<courier_redis::RedisTransport>,
    Keys,
) {
    let group = courier_test::env::unique_name("workers_g");
    let stream = courier_test::env::unique_name("workers_s");
    let dsn = courier_core::Dsn::parse(&format!("redis://x?group={group}{extra}")).unwrap();
    let options = h
        .options(&stream)
        .group(group.clone())
        .from_dsn(&dsn)
        .unwrap();
    let a = h.with_options(options.clone()).await;
    let b = h.with_options(options.consumer("second")).await;
    (
        a,
        b,
        Keys {
            url: h.url.clone(),
            group,
        },
    )
}

fn reg(t: &courier_redis::RedisTransport) -> &dyn WorkerRegistry {
    t.abilities()
        .worker_registry
        .expect("a Redis transport has a worker registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_worker_registered_on_one_connection_is_listed_with_counts_on_another() {
    let h = RedisHarness::new();
    let (a, b, _keys) = two(&h, "").await;
    let before = now_ms();
    within(reg(&a).register(&record("w1"))).await.unwrap();
    let listed = within(reg(&b).list()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let w = &listed[0];
    assert_eq!(
        (w.id.as_str(), w.host.as_str(), w.pid),
        ("w1", "host-a", 42)
    );
    assert_eq!(w.transports, vec!["async".to_owned()]);
    assert!(
        (before - 5_000..=now_ms() + 5_000).contains(&w.started_at_ms),
        "the server's TIME in ms: {}",
        w.started_at_ms
    );
    let mut counted = record("w1");
    counted.handled = 9;
    counted.failed = 1;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let beat = within(reg(&a).heartbeat(&counted)).await.unwrap();
    assert_eq!(beat, Heartbeat::new(false, false));
    let listed = within(reg(&b).list()).await.unwrap();
    assert_eq!((listed[0].handled, listed[0].failed), (9, 1));
    assert_eq!(
        listed[0].started_at_ms, w.started_at_ms,
        "the start time is kept"
    );
    assert!(listed[0].last_heartbeat_ms > w.last_heartbeat_ms);
    within(reg(&b).unregister("w1")).await.unwrap();
    within(reg(&b).unregister("nobody")).await.unwrap();
    assert!(within(reg(&a).list()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_stop_request_survives_heartbeats_until_the_worker_registers_again() {
    let h = RedisHarness::new();
    let (a, b, _keys) = two(&h, "").await;
    for id in ["w1", "w2"] {
        within(reg(&a).register(&record(id))).await.unwrap();
    }
    assert_eq!(within(reg(&b).request_stop(Some("w2"))).await.unwrap(), 1);
    assert_eq!(within(reg(&b).request_stop(Some("w9"))).await.unwrap(), 0);
    assert!(
        !within(reg(&a).heartbeat(&record("w1")))
            .await
            .unwrap()
            .stop_requested
    );
    for _ in 0..2 {
        let beat = within(reg(&a).heartbeat(&record("w2"))).await.unwrap();
        assert!(beat.stop_requested, "a heartbeat never clears the request");
    }
    let listed = within(reg(&b).list()).await.unwrap();
    assert_eq!(
        listed.iter().map(|w| w.stop_requested).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(within(reg(&b).request_stop(None)).await.unwrap(), 2);
    within(reg(&a).register(&record("w1"))).await.unwrap();
    assert!(
        !within(reg(&a).heartbeat(&record("w1")))
            .await
            .unwrap()
            .stop_requested
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn stale_records_are_pruned_by_list_and_not_asked_to_stop() {
    let h = RedisHarness::new();
    let (a, _b, keys) = two(&h, "&worker_stale_after=10s").await;
    assert_eq!(reg(&a).stale_after(), Duration::from_secs(10));
    within(reg(&a).register(&record("live"))).await.unwrap();
    within(reg(&a).register(&record("dead"))).await.unwrap();
    // Age the dead one's heartbeat by 11 s, as a worker that stopped beating would be.
    let client = redis::Client::open(h.url.as_str()).unwrap();
    let mut conn = within(client.get_multiplexed_async_connection())
        .await
        .unwrap();
    let hash = format!("{}:workers", keys.group);
    let json: String = within(
        redis::cmd("HGET")
            .arg(&hash)
            .arg("dead")
            .query_async(&mut conn),
    )
    .await
    .unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let beat = value["last_heartbeat_ms"].as_i64().unwrap();
    value["last_heartbeat_ms"] = serde_json::json!(beat - 11_000);
    let () = within(
        redis::cmd("HSET")
            .arg(&hash)
            .arg("dead")
            .arg(value.to_string())
            .query_async(&mut conn),
    )
    .await
    .unwrap();
    assert_eq!(
        within(reg(&a).request_stop(None)).await.unwrap(),
        1,
        "only the live one"
    );
    let ids: Vec<String> = within(reg(&a).list())
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(ids, ["live"]);
    let left: u64 = within(redis::cmd("HLEN").arg(&hash).query_async(&mut conn))
        .await
        .unwrap();
    assert_eq!(left, 1, "the stale record was deleted");
    let beat = within(reg(&a).heartbeat(&record("dead"))).await.unwrap();
    assert_eq!(
        beat,
        Heartbeat::new(false, true),
        "a late heartbeat registers it again"
    );
}
