//! A relay into a Redis that restarts with a dataset to read back: for as long as the restarted
//! server answers `LOADING`, the relay waits and retries (it used to stop with a protocol
//! error), then forwards every message of the outbox. A private `redis-server` (append-only
//! file on), stopped with `SHUTDOWN` so that nothing it confirmed is lost.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use courier_chaos::server::{Kind, Server, missing_binaries};
use courier_core::relay::{Relay, RelayOptions};
use courier_core::{CancellationToken, Dsn, Envelope, Message, MessageRegistry, Transport};
use courier_redis::{RedisOptions, RedisTransport};
use courier_sql::SqlTransport;
use courier_test::env::unique_name;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Numbered {
    n: u32,
}

impl Message for Numbered {
    const NAME: &'static str = "test.numbered";
}

/// Keys written before the restart: enough for the server to answer `LOADING` for a while
/// (about a second here) when it reads its append-only file back.
const KEYS: u32 = 1_000_000;
const FIRST: u32 = 500;
const TOTAL: u32 = 2_000;

async fn send(outbox: &SqlTransport, range: std::ops::Range<u32>) {
    let batch: Vec<Envelope> = range.map(|n| Envelope::new(Numbered { n })).collect();
    outbox.send_batch(batch).await.unwrap();
}

async fn stream_len(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let Ok(mut c) = client.get_multiplexed_async_connection().await else {
        return 0;
    };
    redis::cmd("XLEN")
        .arg("messages")
        .query_async(&mut c)
        .await
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the server binaries: run via scripts/test"]
async fn a_relay_waits_out_a_restarted_redis_loading_its_dataset() {
    let missing = missing_binaries(Kind::Redis);
    assert!(
        missing.is_empty(),
        "this test starts its own Redis and needs {}: install the redis-server package \
         (scripts/services does)",
        missing.join(", ")
    );
    let dir = std::env::temp_dir().join(unique_name("courier_loading"));
    let mut server = Server::start(Kind::Redis, &dir).await.unwrap();
    let url = server.dsn();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    // In chunks short enough for the client's response timeout on a loaded machine.
    for start in (0..KEYS).step_by(10_000) {
        redis::cmd("EVAL")
            .arg("for i = ARGV[1], ARGV[1] + 9999 do redis.call('SET', 'k' .. i, 'v') end")
            .arg(0)
            .arg(start)
            .query_async::<()>(&mut admin)
            .await
            .unwrap();
    }

    let registry = Arc::new(MessageRegistry::new().with::<Numbered>());
    let outbox_dsn = Dsn::parse(&format!("sqlite://{}", dir.join("outbox.db").display())).unwrap();
    let outbox = Arc::new(
        SqlTransport::connect("outbox", &outbox_dsn, registry.clone())
            .await
            .unwrap(),
    );
    let destination = RedisTransport::connect(&url, RedisOptions::default(), registry)
        .await
        .unwrap();
    destination
        .abilities()
        .setup
        .unwrap()
        .setup()
        .await
        .unwrap();
    let destination = Arc::new(destination);

    send(&outbox, 0..FIRST).await;
    let relay = Relay::new("outbox", outbox.clone(), "redis", destination.clone()).options(
        RelayOptions::default()
            .batch_size(50)
            .limit(Some(u64::from(TOTAL))),
    );
    let stop = CancellationToken::new();
    let relaying = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while stream_len(&url).await < u64::from(FIRST) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first messages never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The rest goes in while the server stops (SHUTDOWN: the append-only file is synced) and
    // comes back, reading a million keys before it serves again.
    send(&outbox, FIRST..TOTAL).await;
    let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut admin).await;
    let saw_loading = Arc::new(AtomicBool::new(false));
    let probing = tokio::spawn({
        let (url, saw) = (url.clone(), saw_loading.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while tokio::time::Instant::now() < deadline {
                if let Ok(client) = redis::Client::open(url.as_str())
                    && let Ok(mut c) = client.get_multiplexed_async_connection().await
                {
                    match redis::cmd("PING").query_async::<String>(&mut c).await {
                        Ok(_) => return,
                        Err(e) if e.code() == Some("LOADING") => saw.store(true, Ordering::SeqCst),
                        Err(_) => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    server.restart().await.unwrap();
    probing.await.unwrap();
    assert!(
        saw_loading.load(Ordering::SeqCst),
        "the restarted server never answered LOADING: the test did not exercise what it is for"
    );

    let stats = tokio::time::timeout(Duration::from_secs(60), relaying)
        .await
        .expect("the relay finished after the server came back")
        .unwrap()
        .expect("the relay waited the loading out instead of failing");
    assert_eq!(stats.relayed, u64::from(TOTAL));
    let left = outbox
        .abilities()
        .message_count
        .unwrap()
        .message_count()
        .await
        .unwrap();
    assert_eq!(left, 0, "the outbox is empty");

    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < TOTAL as usize && tokio::time::Instant::now() < deadline {
        let got = destination.get(500).await.unwrap();
        for envelope in &got {
            seen.insert(envelope.message::<Numbered>().unwrap().n);
        }
        destination.ack_batch(&got).await.unwrap();
    }
    let missing: Vec<u32> = (0..TOTAL).filter(|n| !seen.contains(n)).collect();
    assert!(missing.is_empty(), "lost across the restart: {missing:?}");
    stop.cancel();
}
