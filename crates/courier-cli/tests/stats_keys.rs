//! `courier stats --keys` on a Redis keyed queue (`concurrency_max=2`): per key, in flight / max
//! and queued, the 10 busiest keys and the rest summed as `other`, in text and JSON.

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Env, block_on, redis_streams};
use courier_core::{ConcurrencyKeyStamp, Envelope, MessageRegistry, Transport};
use courier_redis::{RedisOptions, RedisTransport};
use courier_test::TestMessage;

#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn stats_keys_shows_in_flight_max_and_queued_per_key() {
    let (_keys, dsn) = redis_streams("cli_keys", &["jobs"]);
    let dsn = format!("{}&concurrency_max=2", dsn("jobs"));
    let env = Env::empty();
    env.write("c.toml", &format!("[transports.jobs]\ndsn = \"{dsn}\"\n"));
    // t1: 5 messages, t2: 3, k00..k11: 1 each; one get of 20 takes 2 of t1, 2 of t2 and each k.
    block_on(async {
        let url = dsn.split('?').next().unwrap().to_owned();
        let stream = dsn
            .split("stream=")
            .nth(1)
            .and_then(|s| s.split('&').next())
            .unwrap()
            .to_owned();
        let options = RedisOptions::default().stream(stream).concurrency_max(2);
        let registry = Arc::new(MessageRegistry::new().with::<TestMessage>());
        let t = RedisTransport::connect(&url, options, registry)
            .await
            .unwrap();
        let keyed = |seq, key: &str| {
            Envelope::new(TestMessage::new(seq)).with(ConcurrencyKeyStamp::new(key).unwrap())
        };
        let mut batch: Vec<Envelope> = (0..5).map(|i| keyed(i, "t1")).collect();
        batch.extend((5..8).map(|i| keyed(i, "t2")));
        batch.extend((0..12).map(|i| keyed(100 + i, &format!("k{i:02}"))));
        t.send_batch(batch).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), t.get(20))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 16, "2 of t1, 2 of t2, one of each k");
    });
    let out = env
        .run(&["--config", "c.toml", "stats", "--keys", "--format", "json"])
        .json();
    let jobs = &out["jobs"];
    assert_eq!(jobs["max"], 2, "{out}");
    let keys = jobs["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 10, "the 10 busiest: {out}");
    assert_eq!(
        keys[0],
        serde_json::json!({"key": "t1", "in_flight": 2, "queued": 3})
    );
    assert_eq!(
        keys[1],
        serde_json::json!({"key": "t2", "in_flight": 2, "queued": 1})
    );
    assert_eq!(jobs["other_keys"], 4, "{out}");
    assert_eq!(
        jobs["other"],
        serde_json::json!({"key": "other", "in_flight": 4, "queued": 0})
    );
    let text = env.run(&["--config", "c.toml", "stats", "--keys"]);
    let text = text.ok();
    assert!(
        text.lines().any(|l| l.contains("jobs")
            && l.contains("t1")
            && l.contains("2 / 2")
            && l.contains('3')),
        "{text}"
    );
    assert!(text.contains("other (4 keys)"), "{text}");
}
