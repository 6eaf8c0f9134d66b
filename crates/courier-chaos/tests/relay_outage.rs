//! The relay through its servers' crashes: a PostgreSQL outbox relayed to Redis by a real
//! `courier relay` process while a producer keeps committing orders; the outbox's server is
//! killed (`kill -9`) and restarted, then the destination's. The relay process rides out both
//! (it neither exits nor stalls: messages flow again after each restart), and in the end every
//! order the producer saw committed is at the destination, nothing it never wrote is, and the
//! outbox is empty. Both servers are private instances on free ports; the shared ones are never
//! touched.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_chaos::outbox::OutboxOrder;
use courier_chaos::server::{Kind, Server, missing_binaries};
use courier_core::{Dsn, Envelope, FactoryContext, MessageRegistry, Transport, TransportRegistry};
use courier_test::env::unique_name;
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Orders per producer batch, one batch every [`EVERY`].
const BATCH: i64 = 20;
const EVERY: Duration = Duration::from_millis(20);

/// What the producer knows: the orders whose insert returned success, and those whose insert
/// failed (the server died around it: they may or may not have committed).
#[derive(Default)]
struct Produced {
    committed: BTreeSet<i64>,
    uncertain: BTreeSet<i64>,
}

async fn transport(name: &str, dsn: &str) -> Arc<dyn Transport> {
    let mut factories = TransportRegistry::new();
    factories.register(Arc::new(courier_sql::SqlTransportFactory));
    factories.register(Arc::new(courier_redis::RedisTransportFactory));
    let registry = Arc::new(MessageRegistry::new().with::<OutboxOrder>());
    let t = factories
        .create(FactoryContext::new(name, Dsn::parse(dsn).unwrap()).registry(registry))
        .await
        .unwrap();
    t.as_setup().unwrap().setup().await.unwrap();
    t
}

/// Commits a batch of new orders every [`EVERY`] until `stop` turns true; a failed batch is
/// not retried (its orders are uncertain), the next takes new ids.
async fn produce(
    outbox: Arc<dyn Transport>,
    produced: Arc<Mutex<Produced>>,
    stop: watch::Receiver<bool>,
) {
    let mut next = 0;
    while !*stop.borrow() {
        let ids: Vec<i64> = (next..next + BATCH).collect();
        next += BATCH;
        let envelopes = ids
            .iter()
            .map(|&id| Envelope::new(OutboxOrder { id }))
            .collect();
        let sent = tokio::time::timeout(Duration::from_secs(5), outbox.send_batch(envelopes)).await;
        {
            let mut p = produced.lock().unwrap();
            match sent {
                Ok(Ok(_)) => p.committed.extend(ids),
                _ => p.uncertain.extend(ids),
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Takes what the destination holds into `arrived`, until a fetch comes back short (the relay
/// keeps adding: waiting for an empty destination might never end).
async fn collect(dest: &Arc<dyn Transport>, arrived: &mut Vec<i64>) {
    loop {
        let got = dest.get(500).await.unwrap();
        arrived.extend(got.iter().map(|e| e.message::<OutboxOrder>().unwrap().id));
        dest.ack_batch(&got).await.unwrap();
        if got.len() < 500 {
            return;
        }
    }
}

/// Waits (bounded) until the destination received more than `than` messages in all.
async fn flows_past(
    dest: &Arc<dyn Transport>,
    arrived: &mut Vec<i64>,
    than: usize,
    after: &str,
    relay: &mut Child,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        collect(dest, arrived).await;
        if arrived.len() > than {
            return;
        }
        assert!(
            relay.try_wait().unwrap().is_none(),
            "the relay process exited {after}"
        );
        assert!(
            Instant::now() < deadline,
            "nothing reached the destination within 60 s {after} ({than} before)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kills `server` mid-relay (`kill -9`), restarts it 1.5 s later, then waits until messages
/// flow to the destination again.
async fn restart(
    server: &mut Server,
    dest: &Arc<dyn Transport>,
    arrived: &mut Vec<i64>,
    after: &str,
    relay: &mut Child,
) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.restart().await.unwrap();
    collect(dest, arrived).await;
    let seen = arrived.len();
    flows_past(dest, arrived, seen, after, relay).await;
}

async fn outbox_rows(pool: &sqlx::PgPool) -> Option<i64> {
    sqlx::query_scalar("SELECT COUNT(*) FROM relay_outbox")
        .fetch_one(pool)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the PostgreSQL and Redis server binaries: run via scripts/test"]
async fn the_relay_rides_out_its_outbox_and_destination_servers_restarting() {
    rides_out_restarts("").await;
}

/// The same through a cursor outbox (`cursor=true`): the relay's lease dies with the outbox's
/// server; it takes the cursor again once the server is back and goes on from where it stood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the PostgreSQL and Redis server binaries: run via scripts/test"]
async fn a_cursor_relay_rides_out_its_outbox_and_destination_servers_restarting() {
    rides_out_restarts("&cursor=true").await;
}

/// The scenario above, on an outbox opened with extra DSN options (`&k=v...`).
async fn rides_out_restarts(outbox_options: &str) {
    let missing: Vec<String> = [Kind::Postgres, Kind::Redis]
        .into_iter()
        .flat_map(missing_binaries)
        .collect();
    assert!(
        missing.is_empty(),
        "this test starts its own PostgreSQL and Redis and needs their binaries: missing {}; \
         scripts/services installs the Debian packages (PostgreSQL's initdb and postgres must be \
         reachable as /usr/local/bin/initdb and /usr/local/bin/postgres)",
        missing.join(", ")
    );
    let dir = std::env::temp_dir().join(unique_name("courier_relay_outage"));
    let mut pg = Server::start(Kind::Postgres, &dir.join("pg"))
        .await
        .unwrap();
    let mut redis = Server::start(Kind::Redis, &dir.join("redis"))
        .await
        .unwrap();
    let outbox_dsn = format!(
        "{}?table_name=relay_outbox&queue_name=outbox{outbox_options}",
        pg.dsn()
    );
    let dest_dsn = format!("{}?stream=relay_dest", redis.dsn());
    let config = dir.join("courier.toml");
    std::fs::write(
        &config,
        format!("[transports.outbox]\ndsn = \"{outbox_dsn}\"\n\n[transports.dest]\ndsn = \"{dest_dsn}\"\n"),
    )
    .unwrap();
    let outbox = transport("outbox", &outbox_dsn).await;
    let dest = transport("dest", &dest_dsn).await;
    let pool = sqlx::PgPool::connect(&pg.dsn()).await.unwrap();

    let mut relay = Command::new(env!("CARGO_BIN_EXE_outbox-worker"))
        .args(["--config", config.to_str().unwrap(), "-q"])
        .args([
            "relay",
            "--from",
            "outbox",
            "--to",
            "dest",
            "--batch-size",
            "50",
        ])
        // The relay needs none of the handler's settings; the binary reads them at start.
        .env("OUTBOX_DB", pg.dsn())
        .env("OUTBOX_EFFECTS", "unused_effects")
        .env("OUTBOX_INBOX", "unused_inbox")
        .env_remove("OUTBOX_RELAY_PAUSE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let produced = Arc::new(Mutex::new(Produced::default()));
    let (stop, stopped) = watch::channel(false);
    let producer = tokio::spawn(produce(outbox.clone(), produced.clone(), stopped));
    let mut arrived = Vec::new();

    flows_past(&dest, &mut arrived, 0, "before any outage", &mut relay).await;
    // The outbox's server dies mid-relay: held drains die with their connections, their rows
    // come back when it restarts; a cursor's lease dies with its session, and the cursor
    // stands where its last committed move left it.
    let after = "after the outbox's server restarted";
    restart(&mut pg, &dest, &mut arrived, after, &mut relay).await;
    // Then the destination's: sends fail until it is back (its AOF keeps what it confirmed).
    let after = "after the destination's server restarted";
    restart(&mut redis, &dest, &mut arrived, after, &mut relay).await;
    stop.send(true).unwrap();
    producer.await.unwrap();

    // Everything the producer committed ends up at the destination, and the outbox empties.
    let produced = std::mem::take(&mut *produced.lock().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        collect(&dest, &mut arrived).await;
        let have: BTreeSet<i64> = arrived.iter().copied().collect();
        let missing: Vec<i64> = produced.committed.difference(&have).copied().collect();
        if missing.is_empty() && outbox_rows(&pool).await == Some(0) {
            break;
        }
        assert!(
            relay.try_wait().unwrap().is_none(),
            "the relay process exited"
        );
        assert!(
            Instant::now() < deadline,
            "60 s after the last outage, {} committed orders never arrived (first: {:?}); outbox rows: {:?}",
            missing.len(),
            missing.first(),
            outbox_rows(&pool).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    relay.kill().await.unwrap();
    let have: BTreeSet<i64> = arrived.iter().copied().collect();
    let unknown: Vec<i64> = have
        .iter()
        .filter(|id| !produced.committed.contains(id) && !produced.uncertain.contains(id))
        .copied()
        .collect();
    assert!(
        unknown.is_empty(),
        "orders nobody wrote arrived: {unknown:?}"
    );
    println!(
        "relay{outbox_options} through two server restarts: {} orders committed ({} uncertain), {} arrived, {} of them again (at least once)",
        produced.committed.len(),
        produced.uncertain.len(),
        have.len(),
        arrived.len() - have.len()
    );
    drop((pg, redis));
    let _ = std::fs::remove_dir_all(&dir);
}
