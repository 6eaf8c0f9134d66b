//! Running an example (`examples/NAME.rs` of the test's package) as a real process from a test: cargo gives tests the
//! path of the package's binaries (`CARGO_BIN_EXE_*`), not of its examples, so the example is
//! built here, into the target directory and profile of the running test, with the features
//! the test was built with (then nothing else is rebuilt; under `cargo test` the examples are
//! usually built already and this is a no-op).

#![allow(dead_code, reason = "each test file uses a part")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The package's features this test was built with (a feature missing here only costs a
/// rebuild of the example with another feature set). The facade's tests and courier-cli's share
/// this file, and each package has features the other lacks.
#[allow(
    unexpected_cfgs,
    reason = "the union of the facade's and courier-cli's features"
)]
fn features() -> Vec<&'static str> {
    let all = [
        ("default", cfg!(feature = "default")),
        ("sql", cfg!(feature = "sql")),
        ("sqlite", cfg!(feature = "sqlite")),
        ("postgres", cfg!(feature = "postgres")),
        ("mysql", cfg!(feature = "mysql")),
        ("redis", cfg!(feature = "redis")),
        ("amqp", cfg!(feature = "amqp")),
        ("nats", cfg!(feature = "nats")),
        ("runs", cfg!(feature = "runs")),
        ("otel", cfg!(feature = "otel")),
        ("dashboard", cfg!(feature = "dashboard")),
        ("agent", cfg!(feature = "agent")),
        ("mimalloc", cfg!(feature = "mimalloc")),
        ("full", cfg!(feature = "full")),
    ];
    all.into_iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| f)
        .collect()
}

/// Builds `examples/NAME.rs` and returns the path of its binary.
pub(crate) fn example(name: &str) -> PathBuf {
    // The test runs as <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("<target>/<profile>/deps/<test>")
        .to_path_buf();
    let target_dir = profile_dir.parent().expect("<target>/<profile>");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("no profile directory in {}", exe.display()),
    };
    let output = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "--example",
            name,
            "--no-default-features",
        ])
        .args(["--features", &features().join(",")])
        .args(["--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build --example {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.exists(), "no {} after the build", bin.display());
    bin
}

/// A child process whose standard output is read line by line on a thread of its own.
pub(crate) struct Running {
    pub(crate) child: Child,
    lines: Receiver<String>,
    /// Every line read so far, for failure messages.
    pub(crate) seen: Vec<String>,
}

impl Running {
    /// Starts `command` with its standard output piped.
    pub(crate) fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to `limit`) for a line that contains `needle`; returns it. Panics, with what
    /// was printed, when the output ends or the limit passes first.
    pub(crate) fn wait_for(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no line with {needle:?} within {limit:?}; printed: {:#?}",
                        self.seen
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the output ended before a line with {needle:?}; printed: {:#?}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Sends the signal `name` (`TERM`, `INT`) to the process.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (up to `limit`) for the process to exit; returns its status. Kills it and panics
    /// when it does not exit in time.
    pub(crate) fn exit_status(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // What it printed on its way out.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                    self.seen.push(line);
                }
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "the process did not exit within {limit:?}; printed: {:#?}",
                    self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    /// A test that fails midway leaves no process behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 request on a fresh connection to 127.0.0.1; returns the status and body.
pub(crate) fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the example");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

/// What a finished command printed.
pub(crate) struct Finished {
    pub(crate) status: std::process::ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs `command` to its end (killed, and the test failed, past `limit`).
pub(crate) fn run_to_end(mut command: Command, limit: Duration) -> Finished {
    use std::io::Read;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not finish within {limit:?}; stderr: {}",
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Finished {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}
