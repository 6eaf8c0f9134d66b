//! `courier failed` as Messenger's `messenger:failed:*`: `--stats`, `--class-filter`, the body in
//! `show ID`, `retry --to`, and the interactive retry / remove on a terminal (a pseudo-terminal
//! made by util-linux `script`, as an operator's shell would be).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Env, service_url, unique, wait};

/// Where the three transports (`async`, `other`, `failed`) live, and how a raw producer writes
/// a message there.
enum Place {
    Sqlite,
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        table: String,
    },
    #[cfg(feature = "redis")]
    Redis {
        url: String,
        stream: String,
    },
}

impl Place {
    fn config(&self) -> String {
        let dsns: [String; 3] = match self {
            Self::Sqlite => [
                "sqlite://courier.db".into(),
                "sqlite://courier.db?queue_name=other".into(),
                "sqlite://courier.db?queue_name=failed".into(),
            ],
            #[cfg(feature = "postgres")]
            Self::Postgres { url, table } => [
                format!("{url}?table_name={table}"),
                format!("{url}?table_name={table}&queue_name=other"),
                format!("{url}?table_name={table}&queue_name=failed"),
            ],
            #[cfg(feature = "redis")]
            Self::Redis { url, stream } => [
                format!("{url}?stream={stream}"),
                format!("{url}?stream={stream}_other"),
                format!("{url}?stream={stream}_failed"),
            ],
        };
        format!(
            "[transports.async]\ndsn = \"{}\"\nfailure_transport = \"failed\"\n\
             [transports.other]\ndsn = \"{}\"\n[transports.failed]\ndsn = \"{}\"\n",
            dsns[0], dsns[1], dsns[2]
        )
    }

    /// Writes message `n` of type `kind` to the `async` transport as a raw producer would.
    fn seed(&self, env: &Env, n: u32, kind: &str) {
        let body = format!("{{\"n\":{n}}}");
        let headers = format!("{{\"type\":\"{kind}\",\"content-type\":\"application/json\"}}");
        let insert = |table: &str| {
            format!(
                "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
                 VALUES ('default', '{body}', '{headers}', 0, 0, {n})"
            )
        };
        match self {
            Self::Sqlite => env.sql(&insert("courier_messages")),
            #[cfg(feature = "postgres")]
            Self::Postgres { url, table } => common::block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
                sqlx::query(&insert(table))
                    .execute(&mut conn)
                    .await
                    .expect("insert");
            }),
            #[cfg(feature = "redis")]
            Self::Redis { url, stream } => common::block_on(async {
                let client = redis::Client::open(url.as_str()).expect("redis url");
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect");
                redis::cmd("XADD")
                    .arg(stream)
                    .arg("*")
                    .arg("body")
                    .arg(&body)
                    .arg("headers")
                    .arg(&headers)
                    .query_async::<String>(&mut conn)
                    .await
                    .expect("xadd");
            }),
        }
    }
}

/// Drops the place's tables (side tables included) or deletes its streams' keys, pass or fail.
impl Drop for Place {
    fn drop(&mut self) {
        let cleanup = courier_test::Cleanup::new();
        match self {
            Self::Sqlite => {}
            #[cfg(feature = "postgres")]
            Self::Postgres { url, table } => cleanup.sql_tables(url, table),
            #[cfg(feature = "redis")]
            Self::Redis { url, stream } => cleanup.redis_keys(url, stream),
        }
    }
}

/// Three messages of unknown types (`app.a`, `app.a`, `app.b`) moved to the failure transport.
fn with_failed(place: &Place) -> Env {
    let env = Env::empty();
    env.write("courier.toml", &place.config());
    env.run(&["setup"]).ok();
    for (n, kind) in [(1, "app.a"), (2, "app.a"), (3, "app.b")] {
        place.seed(&env, n, kind);
    }
    env.run(&["consume", "async", "--limit", "3", "--sleep", "20ms"])
        .ok();
    env
}

fn failed(env: &Env, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["failed"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json"]);
    env.run(&all).json()
}

/// Runs `courier ARGS` on a pseudo-terminal, typing `answers`.
fn on_terminal(env: &Env, args: &str, answers: &str) -> common::Run {
    let command = format!("{} {args}", env!("CARGO_BIN_EXE_courier"));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .current_dir(env.root())
        .env_remove("COURIER_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux `script` makes the pseudo-terminal (Debian: bsdutils)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(answers.as_bytes())
        .expect("type the answers");
    wait(child, Duration::from_secs(60))
}

fn failed_show_counts_by_type_and_error_class_and_filters_by_type(place: &Place) {
    let env = with_failed(place);
    let stats = failed(&env, &["show", "--stats"]);
    assert_eq!(
        stats,
        serde_json::json!({
            "total": 3,
            "by_type": {"app.a": 2, "app.b": 1},
            "by_error_class": {"decode": 3},
        })
    );
    let text = env.run(&["failed", "show", "--stats"]).ok().to_owned();
    assert!(text.contains("app.a") && text.contains("decode"), "{text}");
    let only_b = failed(&env, &["show", "--class-filter", "app.b"]);
    let rows = only_b.as_array().expect("array");
    assert_eq!(rows.len(), 1, "{only_b}");
    assert_eq!(rows[0]["type"], "app.b");
    let id = rows[0]["id"].as_str().expect("id").to_owned();
    let one = env.run(&["failed", "show", &id]).ok().to_owned();
    assert!(one.contains("body") && one.contains(r#"{"n":3}"#), "{one}");
}

fn failed_retry_class_filter_and_to_send_only_that_type_to_the_chosen_transport(place: &Place) {
    let env = with_failed(place);
    let out = failed(
        &env,
        &["retry", "--all", "--class-filter", "app.a", "--to", "other"],
    );
    assert_eq!(out["done"].as_array().map(Vec::len), Some(2), "{out}");
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(
        stats,
        serde_json::json!({"async": 0, "other": 2, "failed": 1}),
        "both app.a went to `other`, app.b stayed"
    );
    let err = env
        .run(&["failed", "retry", "--all", "--to", "nope"])
        .fails(2)
        .to_owned();
    assert!(err.contains("unknown transport `nope`"), "{err}");
}

fn failed_retry_on_a_terminal_shows_each_message_and_asks(place: &Place) {
    let env = with_failed(place);
    // Oldest first: the first is retried, the second skipped, the third deleted.
    let run = on_terminal(&env, "failed retry --all", "r\ns\nd\n");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.stdout
            .matches("Retry (r), delete (d), skip (s) or quit (q)?")
            .count(),
        3,
        "{}",
        run.stdout
    );
    for shown in [
        "app.a",
        "app.b",
        r#"{"n":1}"#,
        "error class",
        "decode",
        "stamps",
    ] {
        assert!(
            run.stdout.contains(shown),
            "{shown} not shown:\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains("Retried 1 failed message(s), removed 1, skipped 1."),
        "{}",
        run.stdout
    );
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(
        stats,
        serde_json::json!({"async": 1, "other": 0, "failed": 1})
    );
    let left = failed(&env, &["show"]);
    assert_eq!(left[0]["type"], "app.a", "the skipped one stays: {left}");

    // Quit stops at once; without a terminal (or with --force) nothing is asked.
    let run = on_terminal(&env, "failed remove --all", "q\n");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("Removed 0 failed message(s)."),
        "{}",
        run.stdout
    );
    let run = on_terminal(&env, "failed remove --all --force", "");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stdout.contains("Remove it for good"), "{}", run.stdout);
    let stats = env.run(&["stats", "--format", "json"]).json();
    assert_eq!(stats["failed"], 0, "{stats}");
}

/// One `#[test]` per case on SQLite, and ignored-until-configured ones on PostgreSQL and Redis.
macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $case() {
                super::$case(&super::Place::Sqlite);
            })*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(#[test]
            #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
            fn $case() {
                super::$case(&super::Place::Postgres {
                    url: super::service_url("COURIER_TEST_POSTGRES_URL"),
                    table: super::unique("courier_fi"),
                });
            })*
        }
        #[cfg(feature = "redis")]
        mod redis_streams {
            $(#[test]
            #[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
            fn $case() {
                super::$case(&super::Place::Redis {
                    url: super::service_url("COURIER_TEST_REDIS_URL"),
                    stream: super::unique("courier_fi"),
                });
            })*
        }
    };
}

on_every_store!(
    failed_show_counts_by_type_and_error_class_and_filters_by_type,
    failed_retry_class_filter_and_to_send_only_that_type_to_the_chosen_transport,
    failed_retry_on_a_terminal_shows_each_message_and_asks,
);
