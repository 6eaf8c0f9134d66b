//! The demo's worker processes: children of this binary running `courier consume demo` with the
//! demo's configuration, written to a file of their own.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::mpsc;

use crate::error::{CliError, CliResult};

/// The lease of a demo run: short, so a killed worker's run is reaped within seconds.
pub(super) const LEASE: Duration = Duration::from_secs(3);
/// How often each worker process runs the reaper.
pub(super) const REAP_EVERY: Duration = Duration::from_secs(1);
/// How long a fetched, unacknowledged message waits before another worker may take it (so the
/// killed worker's one message comes back too; the reaper recovers its run either way).
const REDELIVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a worker refreshes its in-flight messages, well within `REDELIVER_TIMEOUT`.
const KEEPALIVE: Duration = Duration::from_secs(1);
/// How long a worker may finish its in-flight message when asked to stop.
const GRACE: Duration = Duration::from_secs(5);
/// Lines of a worker's stderr kept to explain its failure.
const TAIL: usize = 20;

/// The demo's configuration: the queue, its failure transport and the run store in one SQLite
/// file, a short lease and the reaper in every worker.
pub(super) fn config(db: &str) -> String {
    // A JSON string is a TOML basic string (same quotes, same escapes).
    let quote = |s: String| serde_json::Value::String(s).to_string();
    let human = |d: Duration| humantime::format_duration(d).to_string();
    format!(
        r#"# Written by `courier demo` for its worker processes (`courier consume demo`).
[transports.demo]
dsn = {queue}
failure_transport = "demo_failed"

[transports.demo_failed]
dsn = {failed}

[routing]
"courier.run_agent" = "demo"

[runs]
store = {store}
lease = "{lease}"
reap_every = "{reap}"
backoff = {{ base = "50ms", cap = "400ms" }}
"#,
        queue = quote(format!(
            "sqlite://{db}?queue_name=demo&redeliver_timeout={}",
            human(REDELIVER_TIMEOUT)
        )),
        failed = quote(format!("sqlite://{db}?queue_name=demo_failed")),
        store = quote(format!("sqlite://{db}")),
        lease = human(LEASE),
        reap = human(REAP_EVERY),
    )
}

/// A directory of the demo's own in the temp directory, holding the workers' configuration file
/// (and the stop file next to it); removed when dropped.
pub(super) struct WorkDir {
    dir: PathBuf,
    config: PathBuf,
}

impl WorkDir {
    /// Creates the directory and writes `config` into it.
    pub(super) fn create(config: &str) -> CliResult<Self> {
        let dir = std::env::temp_dir().join(format!(
            "courier-demo-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let fail = |e: std::io::Error| {
            CliError::runtime(format!(
                "cannot write the workers' configuration in `{}`: {e}",
                dir.display()
            ))
        };
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let work = Self {
            config: dir.join("courier.toml"),
            dir: dir.clone(),
        };
        std::fs::write(&work.config, config).map_err(fail)?;
        Ok(work)
    }

    /// The file `courier consume --config` reads.
    pub(super) fn config(&self) -> &Path {
        &self.config
    }

    /// The file `courier stop-workers` would write for this configuration.
    fn stop_file(&self) -> PathBuf {
        self.dir.join("courier.toml.stop-workers")
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A line a worker process wrote on stderr.
pub(super) struct Line {
    /// The worker's pid.
    pub(super) pid: u32,
    /// The line.
    pub(super) text: String,
}

/// One worker process.
struct Process {
    pid: u32,
    child: Child,
    exit: Option<ExitStatus>,
    tail: VecDeque<String>,
}

/// The worker processes, their stderr merged into one stream of [`Line`]s.
pub(super) struct Workers {
    processes: Vec<Process>,
    lines: mpsc::UnboundedReceiver<Line>,
}

impl Workers {
    /// Starts `n` processes of this binary running `consume demo` with `work`'s configuration,
    /// one message fetched at a time (a killed worker strands at most its one run).
    pub(super) fn start(work: &WorkDir, n: u16) -> CliResult<Self> {
        let exe = std::env::current_exe().map_err(|e| {
            CliError::runtime(format!("cannot find this program to start workers: {e}"))
        })?;
        let human = |d: Duration| humantime::format_duration(d).to_string();
        let (tx, lines) = mpsc::unbounded_channel();
        let mut processes = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let mut child = Command::new(&exe)
                .arg("--config")
                .arg(work.config())
                .args(["consume", "demo", "--fetch-size", "1", "--sleep", "50ms"])
                .args(["--keepalive", &human(KEEPALIVE)])
                .args(["--reap-every", &human(REAP_EVERY)])
                .args(["--grace", &human(GRACE)])
                .env_remove("COURIER_CONFIG")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    CliError::runtime(format!(
                        "cannot start a worker process (`{} consume`): {e}",
                        exe.display()
                    ))
                })?;
            let pid = child
                .id()
                .ok_or_else(|| CliError::runtime("a worker process exited at once"))?;
            if let Some(stderr) = child.stderr.take() {
                tokio::spawn(relay(pid, stderr, tx.clone()));
            }
            processes.push(Process {
                pid,
                child,
                exit: None,
                tail: VecDeque::new(),
            });
        }
        Ok(Self { processes, lines })
    }

    /// The pids, in start order.
    pub(super) fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.pid).collect()
    }

    /// Whether `pid` is one of these workers.
    pub(super) fn contains(&self, pid: u32) -> bool {
        self.processes.iter().any(|p| p.pid == pid)
    }

    /// The lines written since the last call (each also kept in its worker's tail).
    pub(super) fn drain(&mut self) -> Vec<Line> {
        let mut out = Vec::new();
        while let Ok(line) = self.lines.try_recv() {
            self.keep(&line);
            out.push(line);
        }
        out
    }

    fn keep(&mut self, line: &Line) {
        if let Some(p) = self.processes.iter_mut().find(|p| p.pid == line.pid) {
            if p.tail.len() == TAIL {
                p.tail.pop_front();
            }
            p.tail.push_back(line.text.clone());
        }
    }

    /// SIGKILLs worker `pid` (`kill -9`: no chance to finish or release anything) and returns how
    /// it exited.
    pub(super) async fn kill(&mut self, pid: u32) -> CliResult<ExitStatus> {
        let p = self
            .processes
            .iter_mut()
            .find(|p| p.pid == pid)
            .ok_or_else(|| CliError::runtime(format!("no worker process {pid}")))?;
        p.child
            .start_kill()
            .map_err(|e| CliError::runtime(format!("cannot kill worker process {pid}: {e}")))?;
        let status =
            p.child.wait().await.map_err(|e| {
                CliError::runtime(format!("cannot wait for worker process {pid}: {e}"))
            })?;
        p.exit = Some(status);
        Ok(status)
    }

    /// Fails when a worker that was not killed has exited, with the end of its stderr.
    pub(super) async fn check_alive(&mut self) -> CliResult {
        let mut exited = None;
        for p in &mut self.processes {
            if p.exit.is_some() {
                continue;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                p.exit = Some(status);
                exited = Some((p.pid, status));
                break;
            }
        }
        let Some((pid, status)) = exited else {
            return Ok(());
        };
        // Its last lines are on their way through the pipe.
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.drain();
        let tail = self
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| Vec::from(p.tail.clone()).join("\n"))
            .unwrap_or_default();
        Err(CliError::runtime(format!(
            "worker process {pid} exited unexpectedly ({status}){}{tail}",
            if tail.is_empty() { "" } else { ":\n" }
        )))
    }

    /// Asks the live workers to stop like `courier stop-workers` does, waits for them (killing
    /// any still running after their grace period) and returns the lines they wrote meanwhile.
    ///
    /// The request goes through the worker registry, asked again every 250 ms while the workers
    /// stop (a worker restarted a moment ago may not have registered yet); the stop file is
    /// written too, for a build whose demo transport keeps no registry.
    pub(super) async fn stop(
        mut self,
        work: &WorkDir,
        registry: Option<Arc<dyn courier_core::WorkerRegistry>>,
    ) -> CliResult<Vec<Line>> {
        let asking = registry.map(|registry| {
            tokio::spawn(async move {
                loop {
                    if let Err(e) = registry.request_stop(None).await {
                        tracing::debug!(error = %e, "asking the demo workers to stop failed");
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        });
        let stopped = self.stop_processes(work).await;
        if let Some(task) = asking {
            task.abort();
        }
        stopped
    }

    async fn stop_processes(&mut self, work: &WorkDir) -> CliResult<Vec<Line>> {
        let path = work.stop_file();
        std::fs::write(&path, super::super::stop::now_ms().to_string()).map_err(|e| {
            CliError::runtime(format!(
                "cannot write the stop file `{}`: {e}",
                path.display()
            ))
        })?;
        let mut failed = Vec::new();
        for p in &mut self.processes {
            if p.exit.is_some() {
                continue;
            }
            let wait = GRACE + Duration::from_secs(2);
            let status = match tokio::time::timeout(wait, p.child.wait()).await {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => {
                    return Err(CliError::runtime(format!(
                        "cannot wait for worker process {}: {e}",
                        p.pid
                    )));
                }
                Err(_) => {
                    let _ = p.child.start_kill();
                    let _ = p.child.wait().await;
                    failed.push(format!("{} did not stop within {wait:?}", p.pid));
                    continue;
                }
            };
            p.exit = Some(status);
            if !status.success() {
                failed.push(format!("{} exited with {status}", p.pid));
            }
        }
        // Every relay ends with its process's stderr: read what is left.
        let mut lines = Vec::new();
        while let Some(line) = self.lines.recv().await {
            lines.push(line);
        }
        if !failed.is_empty() {
            return Err(CliError::runtime(format!(
                "worker process(es) did not stop cleanly: {}",
                failed.join("; ")
            )));
        }
        Ok(lines)
    }
}

/// Forwards a worker's stderr, line by line, until it closes.
async fn relay(pid: u32, stderr: ChildStderr, tx: mpsc::UnboundedSender<Line>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(text)) = lines.next_line().await {
        if tx.send(Line { pid, text }).is_err() {
            return;
        }
    }
}

/// The exit signal, when the process was killed by one.
pub(super) fn signal(status: ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    {
        std::os::unix::process::ExitStatusExt::signal(&status)
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        None
    }
}

/// The requeued and dead-lettered counts of a reaper report line (`Reaped 1 stale run(s): 1
/// requeued, 0 dead-lettered, 0 skipped.`).
pub(super) fn reaped(line: &str) -> Option<(usize, usize)> {
    let rest = line.trim().strip_prefix("Reaped ")?;
    let (_, counts) = rest.split_once(": ")?;
    let count = |label: &str| -> Option<usize> {
        counts.split(", ").find_map(|part| {
            let (n, name) = part.trim_end_matches('.').split_once(' ')?;
            (name == label).then(|| n.parse().ok()).flatten()
        })
    };
    Some((count("requeued")?, count("dead-lettered")?))
}

/// The pid in a worker identity (`worker:<host>:<pid>:<random>`).
pub(super) fn pid_of(identity: &str) -> Option<u32> {
    let mut parts = identity.rsplit(':');
    parts.next()?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaper_report_line_gives_its_counts() {
        let report = courier_runs::ReapReport {
            selected: 3,
            requeued: 1,
            dead_lettered: 2,
            ..courier_runs::ReapReport::default()
        };
        assert_eq!(reaped(&report.to_string()), Some((1, 2)));
        assert_eq!(reaped("Consuming demo; stop with Ctrl-C."), None);
    }

    #[test]
    fn a_worker_identity_names_its_process() {
        let me = courier_runs::new_worker_identity();
        assert_eq!(pid_of(&me), Some(std::process::id()), "{me}");
        assert_eq!(pid_of("nonsense"), None);
    }

    #[test]
    fn the_workers_configuration_parses_and_validates() {
        let text = config("dir with space/courier \"x\".db");
        let config: courier_core::config::Config = text.parse().expect("parses");
        assert!(config.transports.contains_key("demo"));
        let runs: courier_runs::RunsConfig = config
            .runs
            .expect("[runs]")
            .deserialize()
            .expect("a runs table");
        runs.validate().expect("valid");
        assert_eq!(runs.lease, LEASE);
    }
}
