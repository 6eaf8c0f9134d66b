//! Scheduled messages go through the bus and each tick is delivered exactly once:
//!
//! - a scheduled message of a signed type is signed on its way out, so the worker handles it
//!   instead of moving it to the failure transport (SQLite and PostgreSQL);
//! - a tick whose send failed (its PostgreSQL server, one of the test's own, stopped for a few
//!   seconds) is sent once the server is back, and no tick is sent twice;
//! - two `courier consume` processes on one PostgreSQL configuration send each tick once, also
//!   after the one holding the schedule's lease is SIGKILLed.
//!
//! A tick is told apart by its message id: a UUID version 7 whose timestamp is the tick's time
//! (epoch ms), so the tests read which tick each row in the database is.

#![cfg(all(feature = "sqlite", feature = "postgres"))]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Children, Env, block_on, eventually, service_url, signal, unique, wait};
use serde::{Deserialize, Serialize};
use sqlx::Connection;

/// The scheduled message the in-process application handles.
#[derive(Serialize, Deserialize)]
struct Tick {
    n: u64,
}

impl courier_core::Message for Tick {
    const NAME: &'static str = "test.tick";
}

/// A signing key of the test's own (never a real secret).
const KEY: &str = "schedules-bus-test-key-0123456789abcdef";

/// Runs the command line in this process with a handler of [`Tick`] counting into `handled`.
fn courier(handled: &Arc<AtomicUsize>, config: &Path, args: &[&str]) -> bool {
    let config = config.to_str().expect("utf-8 path");
    let mut all = vec!["courier", "--config", config];
    all.extend_from_slice(args);
    let count = handled.clone();
    let code = courier_cli::App::new()
        .handler_fn("count", move |_: Arc<Tick>| {
            count.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), courier_core::HandlerError>(()) }
        })
        .run_from(all);
    code == std::process::ExitCode::SUCCESS
}

/// `consume` for 4.5 s of a configuration whose `tick` schedule sends a signed `test.tick`
/// every second to `async`: the ticks are handled, none is in `failed`.
fn signed_ticks_are_handled(async_dsn: &str, failed_dsn: &str) {
    let env = Env::empty();
    let config = env.path("c.toml");
    env.write(
        "c.toml",
        &format!(
            "[transports.async]\ndsn = \"{async_dsn}\"\nfailure_transport = \"failed\"\n\n\
             [transports.failed]\ndsn = \"{failed_dsn}\"\n\n\
             [routing]\n\"test.tick\" = \"async\"\n\n\
             [signing]\nkeys = [\"{KEY}\"]\nmessages = [\"test.*\"]\n\n\
             [schedules.tick]\nmessage = \"test.tick\"\npayload = {{ n = 1 }}\nevery = \"1s\"\n"
        ),
    );
    let handled = Arc::new(AtomicUsize::new(0));
    assert!(courier(&handled, &config, &["--quiet", "setup"]), "setup");
    assert!(
        courier(
            &handled,
            &config,
            &[
                "consume",
                "async",
                "--sleep",
                "50ms",
                "--time-limit",
                "4500ms"
            ],
        ),
        "consume"
    );
    let failed = env
        .run(&["--config", "c.toml", "stats", "failed", "--format", "json"])
        .json();
    assert_eq!(
        failed["failed"], 0,
        "no scheduled message in the failure transport: {failed}"
    );
    let handled = handled.load(Ordering::SeqCst);
    assert!(
        (3..=5).contains(&handled),
        "a tick a second handled over 4.5 s, got {handled}"
    );
}

#[test]
fn a_signed_scheduled_message_is_handled_on_sqlite() {
    let env = Env::empty();
    let db = env.path("courier.db");
    let db = db.to_str().expect("utf-8 path");
    signed_ticks_are_handled(
        &format!("sqlite://{db}"),
        &format!("sqlite://{db}?queue_name=failed"),
    );
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn a_signed_scheduled_message_is_handled_on_postgres() {
    let url = service_url("COURIER_TEST_POSTGRES_URL");
    let prefix = unique("cli_sched_signed");
    let _tables = Tables {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let base = format!("{url}{sep}table_name={prefix}_messages");
    signed_ticks_are_handled(
        &format!("{base}&queue_name=async"),
        &format!("{base}&queue_name=failed"),
    );
}

/// Drops the tables whose name starts with `prefix` (a test's own) when dropped.
struct Tables {
    url: String,
    prefix: String,
}

impl Drop for Tables {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        block_on(async move {
            let Ok(mut conn) = sqlx::PgConnection::connect(&url).await else {
                return;
            };
            let names: Vec<String> = sqlx::query_scalar(
                "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema()",
            )
            .fetch_all(&mut conn)
            .await
            .unwrap_or_default();
            for name in names.iter().filter(|n| n.starts_with(&prefix)) {
                // The names are the test's own (`unique` output): letters, digits, `_`.
                let _ = sqlx::query(&format!("DROP TABLE IF EXISTS \"{name}\" CASCADE"))
                    .execute(&mut conn)
                    .await;
            }
        });
    }
}

/// The tick of each message in `queue` of `table` (the timestamp of its UUIDv7 message id), with
/// how many rows carry it. Panics on a row without a message id.
fn ticks_in(url: &str, table: &str, queue: &str) -> BTreeMap<i64, usize> {
    let rows: Vec<String> = block_on(async {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect: {e}"));
        sqlx::query_scalar(&format!(
            "SELECT headers FROM \"{table}\" WHERE queue_name = $1 ORDER BY id"
        ))
        .bind(queue)
        .fetch_all(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("read {table}: {e}"))
    });
    let mut ticks = BTreeMap::new();
    for headers in rows {
        let tick = message_id(&headers)
            .and_then(|id| tick_of(&id))
            .unwrap_or_else(|| panic!("a row without a tick's message id: {headers}"));
        *ticks.entry(tick).or_insert(0) += 1;
    }
    ticks
}

/// The `message-id` stamp of a row's headers.
fn message_id(headers: &str) -> Option<String> {
    let headers: serde_json::Value = serde_json::from_str(headers).ok()?;
    let stamp = headers.get("x-courier-stamp-message-id")?;
    let value: serde_json::Value = match stamp {
        serde_json::Value::String(text) => serde_json::from_str(text).ok()?,
        other => other.clone(),
    };
    match value {
        serde_json::Value::Array(items) => items.last()?.as_str().map(str::to_owned),
        serde_json::Value::String(id) => Some(id),
        _ => None,
    }
}

/// The epoch-ms timestamp of a version 7 UUID.
fn tick_of(id: &str) -> Option<i64> {
    let id = uuid::Uuid::parse_str(id).ok()?;
    if id.get_version_num() != 7 {
        return None;
    }
    let bytes = id.as_bytes();
    Some(
        bytes[..6]
            .iter()
            .fold(0_i64, |ms, b| (ms << 8) | i64::from(*b)),
    )
}

/// Every tick once, one second apart, from the first to the last.
#[track_caller]
fn assert_each_tick_once(ticks: &BTreeMap<i64, usize>) {
    let twice: Vec<_> = ticks.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "ticks sent more than once: {twice:?}");
    let all: Vec<i64> = ticks.keys().copied().collect();
    let gaps: Vec<_> = all
        .windows(2)
        .filter(|w| w[1] - w[0] != 1_000)
        .map(|w| (w[0], w[1]))
        .collect();
    assert!(
        gaps.is_empty(),
        "ticks missing between {gaps:?} (of {all:?})"
    );
}

/// A PostgreSQL server of the test's own on a free port, which it stops and starts again
/// (`initdb` + `postgres` as the `postgres` OS user, as the chaos harness runs them).
struct OwnPostgres {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnPostgres {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut pg = Self {
            dir,
            port,
            child: None,
        };
        let data = pg.dir.path().join("data");
        let status = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(pg.dir.path())
            .status()
            .expect("chown");
        assert!(status.success(), "chown the data directory to postgres");
        let out = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", "/usr/local/bin/initdb", "-D"])
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .output()
            .expect("run initdb (install postgresql and link initdb into /usr/local/bin)");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.spawn();
        pg
    }

    fn dsn(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn spawn(&mut self) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("server log");
        let child = std::process::Command::new("runuser")
            .args(["-u", "postgres", "--", "/usr/local/bin/postgres", "-D"])
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                self.dir.path().display()
            ))
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let dsn = self.dsn();
        eventually("the test's PostgreSQL to accept connections", || {
            block_on(async {
                tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&dsn))
                    .await
                    .is_ok_and(|c| c.is_ok())
            })
        });
    }

    /// Kills the server's process group (`kill -9`): every connection drops at once.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args(["-9", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The rows in `table` of the test's own server.
fn rows(dsn: &str, table: &str) -> i64 {
    block_on(async {
        let Ok(mut conn) = sqlx::PgConnection::connect(dsn).await else {
            return 0;
        };
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM \"{table}\""))
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0)
    })
}

#[test]
#[ignore = "starts a PostgreSQL server of its own (initdb, postgres, runuser)"]
fn a_tick_whose_send_failed_is_sent_once_when_its_server_is_back() {
    let mut pg = OwnPostgres::start();
    let env = Env::empty();
    let store = env.path("store.db");
    let store = store.to_str().expect("utf-8 path");
    // `a_store` (SQLite) keeps the schedule store (first in name order), so the scheduler holds
    // its lease while the server that receives the ticks is down.
    env.write(
        "c.toml",
        &format!(
            "[transports.a_store]\ndsn = \"sqlite://{store}\"\n\n\
             [transports.ticks]\ndsn = \"{}?table_name=ticks_messages&queue_name=ticks&acquire_timeout=1s\"\n\n\
             [routing]\n\"test.tick\" = \"ticks\"\n\n\
             [schedules.tick]\nmessage = \"test.tick\"\npayload = {{ n = 1 }}\nevery = \"1s\"\n\
             missed = \"catch_up\"\n",
            pg.dsn()
        ),
    );
    env.run(&["--config", "c.toml", "setup"]).ok();
    let worker = env.spawn(&[
        "--config", "c.toml", "consume", "a_store", "--sleep", "50ms",
    ]);
    let mut workers = Children(vec![worker]);
    eventually("two ticks sent", || rows(&pg.dsn(), "ticks_messages") >= 2);
    pg.stop();
    let down = common_now_ms();
    // Longer than the pool waits for a connection (`acquire_timeout=1s`): sends fail.
    std::thread::sleep(Duration::from_secs(5));
    pg.spawn();
    let up = common_now_ms();
    std::thread::sleep(Duration::from_secs(4));
    let worker = workers.0.remove(0);
    signal(&worker, "TERM");
    let out = wait(worker, Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ticks = ticks_in(&pg.dsn(), "ticks_messages", "ticks");
    assert_each_tick_once(&ticks);
    let (first, last) = (
        ticks.keys().next().copied().unwrap_or_default(),
        ticks.keys().last().copied().unwrap_or_default(),
    );
    assert!(
        first < down && last > up,
        "the ticks span the outage ({down}..{up}): {first}..{last}; stderr: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("scheduled fire failed"),
        "the failed sends were logged: {}",
        out.stderr
    );
}

fn common_now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit")
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn two_consume_processes_send_each_tick_once_even_when_the_holder_is_killed() {
    let url = service_url("COURIER_TEST_POSTGRES_URL");
    let prefix = unique("cli_sched_two");
    let _tables = Tables {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let table = format!("{prefix}_messages");
    let sep = if url.contains('?') { '&' } else { '?' };
    let base = format!("{url}{sep}table_name={table}");
    let env = Env::empty();
    env.write(
        "c.toml",
        &format!(
            "[transports.async]\ndsn = \"{base}&queue_name=async\"\n\n\
             [transports.ticks]\ndsn = \"{base}&queue_name=ticks\"\n\n\
             [routing]\n\"test.tick\" = \"ticks\"\n\n\
             [schedules.tick]\nmessage = \"test.tick\"\npayload = {{ n = 1 }}\nevery = \"1s\"\n\
             missed = \"catch_up\"\n"
        ),
    );
    env.run(&["--config", "c.toml", "setup"]).ok();
    let spawn = |id: &str| {
        env.spawn(&[
            "--quiet",
            "--config",
            "c.toml",
            "consume",
            "async",
            "--sleep",
            "50ms",
            "--worker-id",
            id,
        ])
    };
    let mut workers = Children(vec![spawn("w0"), spawn("w1")]);
    let start = Instant::now();
    eventually("a lease holder", || owner(&env).is_some());
    std::thread::sleep(Duration::from_secs(6));
    let holder = owner(&env).unwrap_or_else(|| panic!("a lease holder"));
    let index = usize::from(holder == "w1");
    let mut killed = workers.0.remove(index);
    signal(&killed, "KILL");
    let _ = killed.wait();
    eventually("the other worker to take the lease", || {
        owner(&env).is_some_and(|o| o != holder)
    });
    std::thread::sleep(Duration::from_secs(4));
    for child in &workers.0 {
        signal(child, "TERM");
    }
    let left = std::mem::take(&mut workers.0);
    for child in left {
        let _ = wait(child, Duration::from_secs(20));
    }
    let ticks = ticks_in(&url, &table, "ticks");
    assert_each_tick_once(&ticks);
    let elapsed = start.elapsed().as_secs();
    assert!(
        ticks.len() as u64 + 3 >= elapsed,
        "about a tick a second over {elapsed} s, got {}",
        ticks.len()
    );
}

fn owner(env: &Env) -> Option<String> {
    let out = env
        .run(&["--config", "c.toml", "schedules", "--format", "json"])
        .json();
    out[0]["owner"].as_str().map(str::to_owned)
}
