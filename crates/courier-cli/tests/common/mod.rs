//! Drives the real `courier` binary in a temporary directory.

#![allow(dead_code, reason = "each test file uses a part")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A configuration with short backoffs, everything in `courier.db`.
pub(crate) const CONFIG: &str = r#"
[transports.async]
dsn = "sqlite://courier.db"
failure_transport = "failed"
retry = { max_retries = 1, delay = "50ms" }

[transports.failed]
dsn = "sqlite://courier.db?queue_name=failed"

[routing]
"courier.run_agent" = "async"

[runs]
store = "sqlite://courier.db"
backoff = { base = "50ms", cap = "200ms" }
"#;

/// A temporary working directory with the binary.
pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
}

/// What a command printed and how it exited.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Asserts exit 0 and returns stdout.
    #[track_caller]
    pub(crate) fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        &self.stdout
    }

    /// Stdout parsed as JSON (asserting exit 0).
    #[track_caller]
    pub(crate) fn json(&self) -> serde_json::Value {
        let out = self.ok();
        serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }

    /// Asserts a failure with `code`, a message on stderr and no panic.
    #[track_caller]
    pub(crate) fn fails(&self, code: i32) -> &str {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "panic: {}", self.stderr);
        assert!(!self.stderr.trim().is_empty(), "no error message");
        &self.stderr
    }
}

impl Env {
    /// An empty directory (the embedded configuration applies).
    pub(crate) fn empty() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// A directory with [`CONFIG`] as `courier.toml`.
    pub(crate) fn with_config() -> Self {
        let env = Self::empty();
        env.write("courier.toml", CONFIG);
        env
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path(name), text).expect("write file");
    }

    /// The command, in this directory, without inherited configuration.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_courier"));
        c.args(args)
            .current_dir(self.dir.path())
            .env_remove("COURIER_CONFIG")
            .env_remove("COURIER_DSN")
            .env_remove("RUST_LOG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("COURIER_DASHBOARD_TOKEN")
            .stdin(Stdio::null());
        c
    }

    /// Runs to completion (at most 60 s).
    pub(crate) fn run(&self, args: &[&str]) -> Run {
        let child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        wait(child, Duration::from_secs(60))
    }

    /// Starts in the background.
    pub(crate) fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    }

    /// Submits a scripted run and returns its id.
    pub(crate) fn submit(&self, input: &str) -> String {
        let out = self
            .run(&[
                "runs", "submit", "scripted", "--input", input, "--format", "json",
            ])
            .json();
        out["id"].as_str().expect("id").to_owned()
    }

    /// `runs show ID --format json`.
    pub(crate) fn show(&self, id: &str) -> serde_json::Value {
        self.run(&["runs", "show", id, "--format", "json"]).json()
    }

    /// Executes SQL on `courier.db`.
    pub(crate) fn sql(&self, statement: &str) {
        let db = self.path("courier.db");
        block_on(async move {
            use sqlx::ConnectOptions;
            let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&db)
                .busy_timeout(Duration::from_secs(10))
                .connect()
                .await
                .expect("open courier.db");
            sqlx::query(statement)
                .execute(&mut conn)
                .await
                .expect("sql");
        });
    }

    pub(crate) fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// Waits for a child with a deadline, killing it past the deadline.
pub(crate) fn wait(mut child: Child, timeout: Duration) -> Run {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return Run::from(child.wait_with_output().expect("output")),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "timed out after {timeout:?}\nstderr: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Polls `f` every 50 ms until it returns true or 30 s passed.
#[track_caller]
pub(crate) fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// Sends a signal with `kill`.
pub(crate) fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} failed");
}

/// Deletes a test's Redis keys when dropped, pass or fail: every key that starts with one of
/// `keys` (a stream's name covers its `:delayed`, `:paused`, `:limit`, ... keys).
#[cfg(feature = "redis")]
pub(crate) struct RedisKeys {
    pub(crate) url: String,
    pub(crate) keys: Vec<String>,
}

#[cfg(feature = "redis")]
impl Drop for RedisKeys {
    fn drop(&mut self) {
        let cleanup = courier_test::Cleanup::new();
        for prefix in &self.keys {
            cleanup.redis_keys(&self.url, prefix);
        }
    }
}

/// A service URL from the environment (`COURIER_TEST_POSTGRES_URL`, `..._MYSQL_URL`,
/// `..._REDIS_URL`, `..._AMQP_URL`); panics with instructions when it is not set.
pub(crate) fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "set {var} (scripts/services prints it; e.g. COURIER_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test, \
             COURIER_TEST_REDIS_URL=redis://127.0.0.1:6379, COURIER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f), \
             then run with --include-ignored"
        )
    })
}

/// A name no other test run uses: `prefix`, this process's id and a random suffix.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{:08x}", std::process::id(), fastrand::u32(..))
}

/// Child processes, killed (and reaped) when dropped, so a failing test leaves none behind.
pub(crate) struct Children(pub(crate) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// DSNs of queues in one fresh table on the database `var` names (`COURIER_TEST_POSTGRES_URL`):
/// `dsn("a")` is queue `a` of table `<prefix>_..._messages`. The tables (side tables included)
/// are dropped when the returned closure is.
pub(crate) fn sql_queues(var: &str, prefix: &str) -> impl Fn(&str) -> String {
    let url = service_url(var);
    let sep = if url.contains('?') { '&' } else { '?' };
    let name = unique(prefix);
    // The closure owns the guard: the tables go when the test drops it, pass or fail.
    let tables = courier_test::Cleanup::new();
    tables.sql_tables(&url, &name);
    let base = format!("{url}{sep}table_name={name}_messages");
    move |queue| {
        let _ = &tables;
        format!("{base}&queue_name={queue}")
    }
}

/// DSNs of fresh Redis streams sharing one group (`dsn("a")` is stream `<name>_a`), and the
/// keys they and their workers make, deleted when the guard drops.
#[cfg(feature = "redis")]
pub(crate) fn redis_streams(prefix: &str, queues: &[&str]) -> (RedisKeys, impl Fn(&str) -> String) {
    let url = service_url("COURIER_TEST_REDIS_URL");
    let sep = if url.contains('?') { '&' } else { '?' };
    let name = unique(prefix);
    // Every stream `<name>_<queue>` of `queues`, its side keys and the group's
    // `<name>:workers...` start with `<name>`.
    let _ = queues;
    let guard = RedisKeys {
        url: url.clone(),
        keys: vec![name.clone()],
    };
    (guard, move |q| {
        format!("{url}{sep}stream={name}_{q}&group={name}")
    })
}

/// Sends `n` messages of the type `type_name`, which no binary knows (so a worker moves each
/// to its failure transport), to transport `name` of the configuration `config`, in batches.
#[cfg(all(feature = "postgres", feature = "redis"))]
pub(crate) fn send_unknown(config: &str, name: &str, type_name: &str, n: usize) {
    use courier_core::config::Config;
    use courier_core::{Encoded, MessageRegistry, TYPE_HEADER, TransportRegistry};
    use std::sync::Arc;

    block_on(async {
        let config: Config = config.parse().unwrap_or_else(|e| panic!("config: {e}"));
        let factories = TransportRegistry::new()
            .with(Arc::new(courier_sql::SqlTransportFactory))
            .with(Arc::new(courier_redis::RedisTransportFactory));
        let registry = Arc::new(MessageRegistry::new());
        let connect = config.connect(&factories, registry.clone());
        let transports = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .unwrap_or_else(|_| panic!("connecting timed out"))
            .unwrap_or_else(|e| panic!("connect: {e}"));
        let transport = transports
            .get(name)
            .unwrap_or_else(|| panic!("transport `{name}`"));
        let envelopes: Vec<_> = (0..n)
            .map(|i| {
                registry
                    .decode(Encoded::new(format!("{{\"n\":{i}}}")).header(TYPE_HEADER, type_name))
            })
            .collect();
        for chunk in envelopes.chunks(250) {
            tokio::time::timeout(
                Duration::from_secs(30),
                transport.send_batch(chunk.to_vec()),
            )
            .await
            .unwrap_or_else(|_| panic!("send timed out"))
            .unwrap_or_else(|e| panic!("send: {e}"));
        }
    });
}
