//! A message that fails for good crosses crates and processes: dispatched on one transport,
//! consumed by a worker whose handler refuses it, moved to a failure transport on another kind
//! of server, retried from the `courier` command line (a process that does not know the message
//! type) and handled once the handler accepts it, with its body intact.
//!
//! The application and the command line read the same `courier.toml`.

#[path = "../../../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier::config::{Config, Transports};
use courier::{CancellationToken, HandlerError, Message, MessageRegistry, WorkerStats};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::{OP, Scratch, within};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    order: u64,
    note: String,
}

impl Message for Charge {
    const NAME: &'static str = "e2e.charge";
}

/// The order the handler refuses while `refusing` is set.
const DECLINED: u64 = 2;
/// A note that a careless re-encoding would change.
const NOTE: &str = "café \"quoted\" \\ ✓ {\"not\": \"json\"}";

/// The application's side: the configured transports, a handler that records what it handled
/// and refuses order 2 for good while `refusing` is set.
struct App {
    transports: Transports,
    handled: Arc<Mutex<Vec<Charge>>>,
    refusing: Arc<AtomicBool>,
}

impl App {
    async fn start(config: &Config) -> Self {
        let registry = Arc::new(MessageRegistry::new().with::<Charge>());
        let transports = within(
            OP,
            "connecting the transports",
            config.connect(&courier::transport_registry(), registry),
        )
        .await
        .expect("the transports connect");
        for (name, transport) in transports.all() {
            let setup = transport
                .as_setup()
                .expect("every transport here has setup");
            within(OP, &format!("setup of {name}"), setup.setup())
                .await
                .unwrap_or_else(|e| panic!("setup of {name}: {e}"));
        }
        Self {
            transports,
            handled: Arc::default(),
            refusing: Arc::new(AtomicBool::new(true)),
        }
    }

    fn bus(&self) -> courier::MessageBus {
        let handled = self.handled.clone();
        let refusing = self.refusing.clone();
        self.transports
            .bus_builder()
            .handler_fn("charge", move |m: Arc<Charge>| {
                let handled = handled.clone();
                let refuse = m.order == DECLINED && refusing.load(Ordering::SeqCst);
                async move {
                    if refuse {
                        return Err(HandlerError::unrecoverable("card declined"));
                    }
                    handled
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((*m).clone());
                    Ok(())
                }
            })
            .build()
    }

    /// Consumes `orders` until `limit` messages were processed.
    async fn consume(&self, limit: u64) -> WorkerStats {
        let worker = self
            .transports
            .worker(self.bus(), &["orders".to_owned()])
            .expect("orders is configured")
            .limit(limit)
            .sleep(Duration::from_millis(20))
            .time_limit(Duration::from_secs(60))
            .build();
        within(
            Duration::from_secs(90),
            "the worker",
            worker.run(CancellationToken::new()),
        )
        .await
        .expect("the worker runs")
    }

    fn handled_orders(&self) -> Vec<u64> {
        let mut orders: Vec<u64> = self
            .handled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| c.order)
            .collect();
        orders.sort_unstable();
        orders
    }
}

/// Runs the `courier` binary built with this package, with `--config config`.
async fn courier(config: &PathBuf, args: &[&str]) -> Value {
    let output = within(
        OP,
        &format!("courier {}", args.join(" ")),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_courier"))
            .arg("--config")
            .arg(config)
            .args(args)
            .args(["--format", "json"])
            .current_dir(config.parent().expect("the config is in a directory"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the courier binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "courier {args:?} exited with {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// The journey, with the message queue at `orders_dsn` and the failure transport at `failed_dsn`.
async fn refused_message_is_retried_from_the_cli(scratch: &Scratch, orders: &str, failed: &str) {
    let config_text = format!(
        "[transports.orders]\ndsn = {orders:?}\nfailure_transport = \"failed\"\n\n\
         [transports.failed]\ndsn = {failed:?}\n\n\
         [routing]\n\"e2e.*\" = \"orders\"\n"
    );
    let config_path = scratch.dir.path().join("courier.toml");
    std::fs::write(&config_path, &config_text).expect("write courier.toml");
    let config: Config = config_text.parse().expect("a valid configuration");
    let app = App::start(&config).await;

    let bus = app.bus();
    for order in 1..=3 {
        let charge = Charge {
            order,
            note: NOTE.to_owned(),
        };
        within(OP, "dispatch", bus.dispatch(charge))
            .await
            .expect("dispatched");
    }
    let stats = app.consume(3).await;
    assert_eq!(
        (stats.handled, stats.moved_to_failure),
        (2, 1),
        "order 2 moves to the failure transport: {stats:?}"
    );
    assert_eq!(app.handled_orders(), [1, 3]);

    let listed = courier(&config_path, &["failed", "show"]).await;
    let rows = listed.as_array().expect("failed show prints an array");
    assert_eq!(rows.len(), 1, "one failed message: {listed}");
    assert_eq!(rows[0]["type"], Charge::NAME);
    assert_eq!(rows[0]["transport"], "orders");
    let error = rows[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("card declined"), "{error}");
    let id = rows[0]["id"]
        .as_str()
        .expect("the failed message has an id");

    let retried = courier(&config_path, &["failed", "retry", id]).await;
    assert_eq!(retried["done"], json!([id]), "{retried}");
    let listed = courier(&config_path, &["failed", "show"]).await;
    assert_eq!(
        listed,
        json!([]),
        "retry removes it from the failure transport"
    );

    app.refusing.store(false, Ordering::SeqCst);
    let stats = app.consume(1).await;
    assert_eq!((stats.handled, stats.failed), (1, 0), "{stats:?}");
    assert_eq!(app.handled_orders(), [1, 2, 3]);
    let retried_charge = app
        .handled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|c| c.order == DECLINED)
        .cloned();
    assert_eq!(
        retried_charge,
        Some(Charge {
            order: DECLINED,
            note: NOTE.to_owned()
        }),
        "the body survives the failure transport and the command line"
    );
    let listed = courier(&config_path, &["failed", "show"]).await;
    assert_eq!(listed, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn sqlite_queue_with_a_redis_failure_transport_is_retried_from_the_cli() {
    let scratch = Scratch::new();
    let orders = scratch.sqlite_dsn("courier.db", "orders");
    let failed = scratch.redis_dsn("failed");
    scratch
        .run(refused_message_is_retried_from_the_cli(
            &scratch, &orders, &failed,
        ))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn redis_queue_with_a_sqlite_failure_transport_is_retried_from_the_cli() {
    let scratch = Scratch::new();
    let orders = scratch.redis_dsn("orders");
    let failed = scratch.sqlite_dsn("courier.db", "failed");
    scratch
        .run(refused_message_is_retried_from_the_cli(
            &scratch, &orders, &failed,
        ))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq and postgres: set COURIER_TEST_AMQP_URL and COURIER_TEST_POSTGRES_URL"]
async fn amqp_queue_with_a_postgres_failure_transport_is_retried_from_the_cli() {
    let scratch = Scratch::new();
    let orders = scratch.amqp_dsn("orders");
    let failed = scratch.postgres_dsn("failed");
    scratch
        .run(refused_message_is_retried_from_the_cli(
            &scratch, &orders, &failed,
        ))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mariadb and redis: set COURIER_TEST_MYSQL_URL and COURIER_TEST_REDIS_URL"]
async fn mariadb_queue_with_a_redis_failure_transport_is_retried_from_the_cli() {
    let scratch = Scratch::new();
    let orders = scratch.mysql_dsn("orders");
    let failed = scratch.redis_dsn("failed");
    scratch
        .run(refused_message_is_retried_from_the_cli(
            &scratch, &orders, &failed,
        ))
        .await;
}
