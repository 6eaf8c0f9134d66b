//! The transactional outbox and the inbox across real crashes (`kill -9` of real processes), on
//! a PostgreSQL outbox relayed to Redis, to RabbitMQ and to NATS JetStream: orders are dispatched in PostgreSQL
//! transactions (even ids commit, odd ones roll back); the relay is killed after the
//! destination confirmed a batch and before its outbox rows are deleted, then after the delete
//! and before the next batch; a consumer is killed after its handler's transaction committed
//! and before the ack. Then a relay and a consumer run to the end: every committed order's side
//! effect (a row in the same database, written with the inbox claim) exists exactly once, and
//! no rolled-back order's.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_amqp::AmqpTransport;
use courier_chaos::outbox::OutboxOrder;
use courier_core::{Dsn, MessageBus, MessageRegistry};
use courier_nats::NatsTransport;
use courier_sql::{Inbox, InboxOptions, SqlTransport, dispatch_in};
use courier_test::env::{amqp_url, nats_url, postgres_url, redis_url, unique_name};
use tokio::process::{Child, Command};

const ORDERS: i64 = 40;

struct Setup {
    dir: PathBuf,
    config: PathBuf,
    pool: sqlx::PgPool,
    effects: String,
    inbox: String,
    outbox_table: String,
    /// Drops the outbox, effects and inbox tables when the test ends, pass or fail.
    _tables: courier_test::Cleanup,
}

impl Setup {
    fn worker(&self, args: &[&str], env: &[(&str, String)]) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-worker"));
        cmd.args(["--config", self.config.to_str().unwrap(), "-q"])
            .args(args)
            .env("OUTBOX_DB", postgres_url())
            .env("OUTBOX_EFFECTS", &self.effects)
            .env("OUTBOX_INBOX", &self.inbox)
            .env_remove("OUTBOX_RELAY_PAUSE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    /// Runs a relay or consumer with `file_var` naming a pause file (and `env`) until it
    /// reaches its pause point, then kills it with SIGKILL.
    async fn kill_at(&self, args: &[&str], file_var: &str, env: &[(&str, &str)], file: &str) {
        let file = self.dir.join(file);
        let mut vars = vec![(file_var, file.to_string_lossy().into_owned())];
        vars.extend(env.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let mut child = self.worker(args, &vars);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !file.exists() {
            assert!(
                Instant::now() < deadline,
                "{args:?} never reached its pause point"
            );
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{args:?} exited before its pause point: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        child.kill().await.unwrap(); // SIGKILL
    }

    async fn effects(&self) -> Vec<i64> {
        sqlx::query_scalar(&format!(
            "SELECT order_id FROM {} ORDER BY order_id",
            self.effects
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn outbox_rows(&self) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", self.outbox_table))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// `outbox_options`: DSN options of the outbox (`&cursor=true`: a cursor outbox).
async fn setup(destination: &str, outbox_options: &str) -> Setup {
    let dir = std::env::temp_dir().join(unique_name("courier_outbox_crash"));
    std::fs::create_dir_all(&dir).unwrap();
    let tables = courier_test::Cleanup::new();
    let outbox_table = tables.postgres_table("outbox_t");
    let effects = tables.postgres_table("outbox_effects");
    let inbox = tables.postgres_table("outbox_inbox");
    let outbox_dsn = format!(
        "{}?table_name={outbox_table}&queue_name=outbox&redeliver_timeout=2s{outbox_options}",
        postgres_url()
    );
    let config = dir.join("courier.toml");
    std::fs::write(
        &config,
        format!(
            "[transports.outbox]\ndsn = \"{outbox_dsn}\"\n\n[transports.dest]\ndsn = \"{destination}\"\n\n\
             [routing]\n\"outbox.order\" = \"outbox\"\n"
        ),
    )
    .unwrap();
    let pool = sqlx::PgPool::connect(&postgres_url()).await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {effects} (order_id BIGINT NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    Inbox::new(pool.clone(), InboxOptions::new(&inbox))
        .await
        .unwrap();

    // The producer: each order in its own transaction, the odd ones rolled back.
    let registry = Arc::new(MessageRegistry::new().with::<OutboxOrder>());
    let outbox = SqlTransport::connect("outbox", &Dsn::parse(&outbox_dsn).unwrap(), registry)
        .await
        .unwrap();
    let bus = MessageBus::builder()
        .transport("outbox", Arc::new(outbox))
        .route("outbox.*", ["outbox"])
        .build();
    for id in 0..ORDERS {
        let mut tx = pool.begin().await.unwrap();
        dispatch_in(&bus, &mut tx, OutboxOrder { id })
            .await
            .unwrap();
        if id % 2 == 0 {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    Setup {
        dir,
        config,
        pool,
        effects,
        inbox,
        outbox_table,
        _tables: tables,
    }
}

async fn every_committed_order_is_handled_exactly_once(destination: String, outbox_options: &str) {
    let s = setup(&destination, outbox_options).await;
    let relay = [
        "relay",
        "--from",
        "outbox",
        "--to",
        "dest",
        "--batch-size",
        "5",
    ];
    // 1. Killed between the destination's confirmation and the outbox delete.
    s.kill_at(
        &relay,
        "OUTBOX_RELAY_PAUSE_FILE",
        &[("OUTBOX_RELAY_PAUSE", "after_confirm")],
        "relay1.pause",
    )
    .await;
    assert_eq!(s.outbox_rows().await, ORDERS / 2, "confirmed, not deleted");
    // 2. Killed between the delete and the next batch.
    s.kill_at(
        &relay,
        "OUTBOX_RELAY_PAUSE_FILE",
        &[("OUTBOX_RELAY_PAUSE", "after_delete")],
        "relay2.pause",
    )
    .await;
    assert_eq!(s.outbox_rows().await, ORDERS / 2 - 5, "one batch deleted");
    // 3. A consumer killed after its handler's transaction committed, before the ack.
    s.kill_at(
        &["consume", "dest"],
        "OUTBOX_PAUSE_AFTER_COMMIT",
        &[],
        "consumer.pause",
    )
    .await;
    assert_eq!(
        s.effects().await.len(),
        1,
        "the killed consumer committed one effect"
    );

    // Then a relay and a consumer run until everything committed is handled.
    let mut relay = s.worker(&relay, &[]);
    let mut consumer = s.worker(&["consume", "dest"], &[]);
    let want: Vec<i64> = (0..ORDERS).filter(|id| id % 2 == 0).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = s.effects().await;
        if got.len() >= want.len() && s.outbox_rows().await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not everything arrived: {got:?}, outbox rows {}",
            s.outbox_rows().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past every redelivery window (2 s): duplicates would have been handled by now.
    tokio::time::sleep(Duration::from_secs(5)).await;
    relay.kill().await.unwrap();
    consumer.kill().await.unwrap();
    assert_eq!(
        s.effects().await,
        want,
        "every committed order exactly once, no rolled-back one"
    );
    let _ = std::fs::remove_dir_all(&s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Redis: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_REDIS_URL"]
async fn postgres_outbox_to_redis_survives_relay_and_consumer_kills() {
    let cleanup = courier_test::Cleanup::new();
    // The group is the stream's name too: its worker registry `<group>:workers` is then the
    // test's own (the default group's `courier:workers` was left behind).
    let stream = cleanup.redis_name("outbox_stream");
    every_committed_order_is_handled_exactly_once(
        format!(
            "{}?stream={stream}&group={stream}&redeliver_timeout=2s&claim_interval=200ms",
            redis_url()
        ),
        "",
    )
    .await;
}

/// The same with a cursor outbox (`cursor=true`): the relay reads by a cursor, and the killed
/// relay's cursor is free at once for the next (a lock of its session, which dies with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and Redis: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_REDIS_URL"]
async fn postgres_cursor_outbox_to_redis_survives_relay_and_consumer_kills() {
    let cleanup = courier_test::Cleanup::new();
    let stream = cleanup.redis_name("outbox_stream");
    every_committed_order_is_handled_exactly_once(
        format!(
            "{}?stream={stream}&group={stream}&redeliver_timeout=2s&claim_interval=200ms",
            redis_url()
        ),
        "&cursor=true",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and RabbitMQ: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_AMQP_URL"]
async fn postgres_outbox_to_rabbitmq_survives_relay_and_consumer_kills() {
    let queue = unique_name("outbox_queue");
    let dsn = format!("{}?exchange={queue}&queues={queue}", amqp_url());
    let cleanup = courier_test::Cleanup::new();
    cleanup.defer(format!("the AMQP exchange and queue {queue}"), {
        let dsn = dsn.clone();
        async move {
            let dsn = Dsn::parse(&dsn).map_err(|e| e.to_string())?;
            let t = AmqpTransport::connect("cleanup", &dsn, Arc::new(MessageRegistry::new()))
                .await
                .map_err(|e| e.to_string())?;
            let deleted = t.delete_topology().await.map_err(|e| e.to_string());
            t.close().await;
            deleted
        }
    });
    every_committed_order_is_handled_exactly_once(dsn, "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and NATS: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_NATS_URL"]
async fn postgres_outbox_to_nats_survives_relay_and_consumer_kills() {
    let stream = unique_name("outbox_stream");
    let dsn = format!("{}?stream={stream}&ack_wait=2s", nats_url());
    let cleanup = courier_test::Cleanup::new();
    cleanup.defer(format!("the NATS stream {stream}"), {
        let dsn = dsn.clone();
        async move {
            let dsn = Dsn::parse(&dsn).map_err(|e| e.to_string())?;
            let t = NatsTransport::connect("cleanup", &dsn, Arc::new(MessageRegistry::new()))
                .await
                .map_err(|e| e.to_string())?;
            let deleted = t.delete_stream().await.map_err(|e| e.to_string());
            t.close().await;
            deleted
        }
    });
    every_committed_order_is_handled_exactly_once(dsn, "").await;
}
