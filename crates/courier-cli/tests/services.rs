//! `courier bench` and `courier failed` against the real servers (run with `--include-ignored`).

#![cfg(any(feature = "postgres", feature = "redis", feature = "amqp"))]

mod common;

use common::{Env, service_url};

/// Runs `courier bench --raw` on `dsn` and checks both sides were measured and compared.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn bench_measures_courier_and_the_raw_driver(var: &str, scheme: &str) {
    let env = Env::empty();
    let mut dsn = service_url(var);
    // On SQL, a message table of its own, dropped with its side tables when the test ends:
    // the bench would otherwise create the default `courier_messages` and leave it.
    let tables = courier_test::Cleanup::new();
    if var == "COURIER_TEST_POSTGRES_URL" {
        let table = common::unique("cli_bench");
        tables.sql_tables(&dsn, &table);
        let sep = if dsn.contains('?') { '&' } else { '?' };
        dsn = format!("{dsn}{sep}table_name={table}");
    }
    let out = env
        .run(&[
            "bench",
            "--dsn",
            &dsn,
            "--messages",
            "500",
            "--raw",
            "--rounds",
            "1",
            "--format",
            "json",
        ])
        .json();
    assert!(
        out["consume_per_s"].as_f64().is_some_and(|v| v > 0.0),
        "{out}"
    );
    assert!(
        out["raw"]["consume_per_s"]
            .as_f64()
            .is_some_and(|v| v > 0.0),
        "{out}"
    );
    assert!(out["ratio"].as_f64().is_some(), "{out}");
    assert!(
        out["dsn"].as_str().is_some_and(|d| d.starts_with(scheme)),
        "{out}"
    );
}

#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn bench_on_postgres_measures_courier_and_the_raw_driver() {
    bench_measures_courier_and_the_raw_driver("COURIER_TEST_POSTGRES_URL", "postgres://");
}

#[cfg(feature = "redis")]
#[test]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
fn bench_on_redis_measures_courier_and_the_raw_driver() {
    bench_measures_courier_and_the_raw_driver("COURIER_TEST_REDIS_URL", "redis://");
}

#[cfg(feature = "amqp")]
#[test]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
fn an_amqp_failure_transport_cannot_be_listed_and_says_so() {
    let env = Env::empty();
    let dsn = service_url("COURIER_TEST_AMQP_URL");
    env.write(
        "amqp.toml",
        &format!(
            "[transports.async]\ndsn = \"in-memory://\"\nfailure_transport = \"failed\"\n\
             [transports.failed]\ndsn = \"{dsn}\"\noptions = {{ exchange = \"courier_cli_test_failed\" }}\n"
        ),
    );
    let err = env
        .run(&["--config", "amqp.toml", "failed", "show"])
        .fails(2)
        .to_owned();
    assert!(err.contains("cannot list"), "{err}");
}

/// A cursor outbox is read by `courier relay` alone: `courier consume` refuses it by name,
/// saying what reads it, and leaves it out when consuming every transport.
#[cfg(feature = "postgres")]
#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn consume_refuses_a_cursor_outbox_and_leaves_it_out_of_every_transport() {
    let env = Env::empty();
    let dsn = service_url("COURIER_TEST_POSTGRES_URL");
    let queue = common::unique("cli_cursor");
    // A table of its own (the default `courier_messages` was left on the server), dropped with
    // its side tables when the test ends, pass or fail.
    let tables = courier_test::Cleanup::new();
    tables.sql_tables(&dsn, &queue);
    env.write(
        "cursor.toml",
        &format!(
            "[transports.outbox]\ndsn = \"{dsn}?table_name={queue}_messages&queue_name={queue}&cursor=true\"\n\
             [transports.async]\ndsn = \"in-memory://\"\n"
        ),
    );
    let err = env
        .run(&[
            "--config",
            "cursor.toml",
            "consume",
            "outbox",
            "--limit",
            "1",
        ])
        .fails(2)
        .to_owned();
    assert!(
        err.contains("outbox") && err.contains("courier relay --from outbox"),
        "{err}"
    );
    // Every transport: the in-memory one alone (no failed claim on the outbox), until its
    // time limit.
    let all = env.run(&["--config", "cursor.toml", "consume", "--time-limit", "1s"]);
    all.ok();
    assert!(
        all.stderr.contains("every transport but outbox") && !all.stderr.contains("unsupported"),
        "{all:?}"
    );
}
