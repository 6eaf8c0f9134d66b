//! Durable runs over every transport: the run store on SQLite or on the transport's own
//! database, `RunAgent` messages on the transport (the requeue delays are the transport's
//! `DelayStamp`), a worker consuming them. Runs that succeed, fail transiently once or twice, or
//! fail for good each settle as expected, with their requeue counts, and nothing is left behind.

mod support;

use std::sync::Arc;
use std::time::Duration;

use courier::amqp::AmqpTransport;
use courier::runs::{
    RunAgent, RunStatus, RunStore, Runtime, RuntimeOptions, ScriptedAgent, SqlRunStore,
    SqlRunStoreOptions, TerminationReason,
};
use courier::{
    CancellationToken, Dsn, FactoryContext, MessageBus, MessageRegistry, Transport, Worker,
};
use serde_json::{Value, json};
use support::{OP, Scratch, with_query, within};
use uuid::Uuid;

/// A scripted run and how it must end.
struct Case {
    input: Value,
    status: RunStatus,
    requeues: u32,
    output: Option<Value>,
    reason: Option<TerminationReason>,
}

fn cases() -> Vec<Case> {
    let completed = |input: Value, requeues: u32, output: &str| Case {
        input,
        status: RunStatus::Completed,
        requeues,
        output: Some(json!(output)),
        reason: Some(TerminationReason::Completed),
    };
    vec![
        completed(
            json!({"steps": [{"sleep_ms": 20}, {"output": "a"}]}),
            0,
            "a",
        ),
        completed(json!({"steps": [{"output": "b"}]}), 0, "b"),
        completed(
            json!({"steps": [{"fail": "server_error", "attempts": 1}, {"output": "c"}]}),
            1,
            "c",
        ),
        completed(
            json!({"steps": [{"sleep_ms": 5}, {"fail": "connection", "attempts": 2}, {"output": "d"}]}),
            2,
            "d",
        ),
        Case {
            input: json!({"steps": [{"fail": "client_error"}]}),
            status: RunStatus::Failed,
            requeues: 0,
            output: None,
            reason: Some(TerminationReason::NotRetryable),
        },
    ]
}

/// Every message the cases make: one per execution.
fn executions(cases: &[Case]) -> u64 {
    cases.iter().map(|c| 1 + u64::from(c.requeues)).sum()
}

async fn store_on(scratch: &Scratch, dsn: &str) -> Arc<dyn RunStore> {
    let options = SqlRunStoreOptions::default().table_prefix(&scratch.prefix);
    let store = within(OP, "run store connect", SqlRunStore::connect(dsn, options))
        .await
        .expect("the run store connects");
    within(OP, "run store setup", store.setup())
        .await
        .expect("the run store sets up");
    Arc::new(store)
}

/// The transport at `dsn`, built by the facade's registry of every transport; an AMQP one is built
/// directly, so that the delay queues it declares can be deleted at the end.
async fn transport_on(scratch: &Scratch, dsn: &str) -> Arc<dyn Transport> {
    let registry = Arc::new(MessageRegistry::new().with::<RunAgent>());
    let dsn = Dsn::parse(dsn).expect("a valid DSN");
    let transport: Arc<dyn Transport> = if dsn.scheme() == "amqp" {
        let amqp = within(
            OP,
            "transport connect",
            AmqpTransport::connect("runs", &dsn, registry),
        )
        .await
        .expect("the transport connects");
        let amqp = Arc::new(amqp);
        scratch.amqp_transport(amqp.clone());
        amqp
    } else {
        within(
            OP,
            "transport connect",
            courier::transport_registry()
                .create(FactoryContext::new("runs", dsn).registry(registry)),
        )
        .await
        .expect("the transport connects")
    };
    let setup = transport
        .as_setup()
        .expect("every transport here has setup");
    within(OP, "transport setup", setup.setup())
        .await
        .expect("the transport sets up");
    transport
}

/// Enqueues every case, consumes until each execution was processed, and checks how each run
/// ended and that no message is left.
async fn every_run_settles(store: Arc<dyn RunStore>, queue: Arc<dyn Transport>) {
    let mut options = RuntimeOptions::default();
    options.backoff.base = Duration::from_millis(100);
    options.backoff.cap = Duration::from_secs(1);
    let runtime = Runtime::builder(store.clone())
        .agent("scripted", ScriptedAgent)
        .options(options)
        .build();
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("runs", queue.clone())
                .route("courier.run_agent", ["runs"]),
        )
        .build();

    let cases = cases();
    let mut ids: Vec<Uuid> = Vec::new();
    for case in &cases {
        let id = within(
            OP,
            "enqueue",
            runtime.enqueue("scripted", case.input.clone()),
        )
        .await
        .expect("enqueued");
        ids.push(id);
    }

    let consume = |limit: Option<u64>, time_limit: Duration| {
        let mut worker = Worker::builder(bus.clone())
            .receiver("runs", queue.clone())
            .concurrency(2)
            .sleep(Duration::from_millis(20))
            .time_limit(time_limit);
        if let Some(limit) = limit {
            worker = worker.limit(limit);
        }
        worker.build().run(CancellationToken::new())
    };
    let stats = within(
        Duration::from_secs(90),
        "the worker",
        consume(Some(executions(&cases)), Duration::from_secs(60)),
    )
    .await
    .expect("the worker runs");
    assert_eq!(
        (stats.handled, stats.failed),
        (executions(&cases), 0),
        "every execution's message is handled (a failed run is a handled message): {stats:?}"
    );

    for (case, id) in cases.iter().zip(&ids) {
        let run = within(OP, "find", store.find(*id))
            .await
            .expect("find")
            .expect("the run exists");
        assert_eq!(
            (
                run.status,
                run.requeue_count,
                &run.output,
                run.termination_reason
            ),
            (case.status, case.requeues, &case.output, case.reason),
            "run {} with input {}",
            run.id,
            case.input
        );
        assert_eq!(run.lease_expires, 0, "a settled run holds no lease");
    }

    let rest = within(
        Duration::from_secs(30),
        "the second worker",
        consume(None, Duration::from_millis(700)),
    )
    .await
    .expect("the worker runs");
    assert_eq!(
        rest.received, 0,
        "no message left on the transport: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_settle_over_sqlite_with_the_store_in_the_same_file() {
    let scratch = Scratch::new();
    let store = store_on(
        &scratch,
        &with_query(&scratch.sqlite_url("courier.db"), "mode=rwc"),
    )
    .await;
    let queue = transport_on(&scratch, &scratch.sqlite_dsn("courier.db", "runs")).await;
    scratch.run(every_run_settles(store, queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn runs_settle_over_postgres_with_the_store_in_the_same_database() {
    let scratch = Scratch::new();
    let dsn = scratch.postgres_dsn("messages");
    scratch
        .run(async {
            let store = store_on(&scratch, &courier_test::env::postgres_url()).await;
            every_run_settles(store, transport_on(&scratch, &dsn).await).await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mariadb: set COURIER_TEST_MYSQL_URL"]
async fn runs_settle_over_mariadb_with_the_store_in_the_same_database() {
    let scratch = Scratch::new();
    let dsn = scratch.mysql_dsn("messages");
    scratch
        .run(async {
            let store = store_on(&scratch, &courier_test::env::mysql_url()).await;
            every_run_settles(store, transport_on(&scratch, &dsn).await).await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn runs_settle_over_redis_with_the_store_on_sqlite() {
    let scratch = Scratch::new();
    let dsn = scratch.redis_dsn("runs");
    scratch
        .run(async {
            let store_dsn = with_query(&scratch.sqlite_url("runs.db"), "mode=rwc");
            let store = store_on(&scratch, &store_dsn).await;
            every_run_settles(store, transport_on(&scratch, &dsn).await).await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn runs_settle_over_rabbitmq_with_the_store_on_sqlite() {
    let scratch = Scratch::new();
    let dsn = scratch.amqp_dsn("runs");
    scratch
        .run(async {
            let store_dsn = with_query(&scratch.sqlite_url("runs.db"), "mode=rwc");
            let store = store_on(&scratch, &store_dsn).await;
            every_run_settles(store, transport_on(&scratch, &dsn).await).await;
        })
        .await;
}
