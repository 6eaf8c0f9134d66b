//! What a scenario measured and which checks failed, printed as one summary line per transport
//! and a detailed list of failures (lost ids, stuck runs with their status, foreign rows in the
//! failure transport, ...).

use std::fmt::Write as _;
use std::path::PathBuf;

/// The outcome of one scenario.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The transport's name.
    pub transport: String,
    /// Plain messages produced.
    pub messages: u64,
    /// Durable runs submitted.
    pub runs: usize,
    /// Workers SIGKILLed (and restarted).
    pub worker_kills: u32,
    /// Servers killed and restarted (`None`: no server, e.g. SQLite).
    pub server_restarts: Option<u32>,
    /// Ids never handled.
    pub lost: Vec<u64>,
    /// Ids handled more than once (among ids the producer sent once).
    pub handled_twice: u64,
    /// The allowed number of ids handled twice: fetch_size x (worker kills + workers x server kills).
    pub twice_bound: u64,
    /// Ids the producer had to send again after a failed send (excluded from `handled_twice`).
    pub resent: u64,
    /// Per server restart: ms from the server accepting connections to the next handled message.
    pub recover_ms: Vec<i64>,
    /// Ms from the last kill until every run was terminal (`None`: never).
    pub runs_terminal_ms: Option<i64>,
    /// Ms from the last kill until every message was handled (`None`: never).
    pub messages_done_ms: Option<i64>,
    /// The allowed time for runs: lease + reap interval + redeliver window.
    pub runs_bound_ms: i64,
    /// Runs by final status (`completed`, `failed:retries_exhausted`, `queued`, ...).
    pub run_statuses: Vec<(String, usize)>,
    /// Poison injected (kinds) and kinds the storage refused.
    pub poison: Vec<String>,
    /// Every check that failed, precisely.
    pub failures: Vec<String>,
    /// Informational lines (what the storage refused, how a server was restarted).
    pub notes: Vec<String>,
    /// The scenario's directory, kept when a check failed.
    pub kept: Option<PathBuf>,
}

fn ms(v: Option<i64>) -> String {
    v.map_or_else(|| "never".into(), |v| format!("{:.1}s", v as f64 / 1000.0))
}

impl Report {
    /// p50 and max of [`Report::recover_ms`].
    #[must_use]
    pub fn recovery(&self) -> Option<(i64, i64)> {
        let mut v = self.recover_ms.clone();
        v.sort_unstable();
        let max = *v.last()?;
        Some((v[(v.len() - 1) / 2], max))
    }

    /// One line: messages, kills, server restarts, lost, handled twice, time to recover.
    #[must_use]
    pub fn summary(&self) -> String {
        let restarts = self
            .server_restarts
            .map_or_else(|| "n/a".into(), |n| n.to_string());
        let recover = self.recovery().map_or_else(
            || "n/a".into(),
            |(p50, max)| format!("p50 {p50} ms, max {max} ms"),
        );
        format!(
            "chaos {:<9} messages {}, runs {}, kills {}, server restarts {}, lost {}, handled twice {} (bound {}), recover {}, runs terminal {} after last kill or server restart (bound {}): {}",
            self.transport,
            self.messages,
            self.runs,
            self.worker_kills,
            restarts,
            self.lost.len(),
            self.handled_twice,
            self.twice_bound,
            recover,
            ms(self.runs_terminal_ms),
            ms(Some(self.runs_bound_ms)),
            if self.failures.is_empty() {
                "PASS".to_owned()
            } else {
                format!("FAIL ({} checks)", self.failures.len())
            }
        )
    }

    /// Every failure and note, one per line.
    #[must_use]
    pub fn details(&self) -> String {
        let mut out = String::new();
        let statuses: Vec<String> = self
            .run_statuses
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        let _ = writeln!(out, "[{}] runs: {}", self.transport, statuses.join(", "));
        let _ = writeln!(
            out,
            "[{}] poison: {}",
            self.transport,
            self.poison.join(", ")
        );
        let _ = writeln!(
            out,
            "[{}] messages all handled {} after last kill or server restart; producer re-sent {} id(s)",
            self.transport,
            ms(self.messages_done_ms),
            self.resent
        );
        for note in &self.notes {
            let _ = writeln!(out, "[{}] note: {note}", self.transport);
        }
        for failure in &self.failures {
            let _ = writeln!(out, "[{}] FAILED: {failure}", self.transport);
        }
        if let Some(dir) = &self.kept {
            let _ = writeln!(
                out,
                "[{}] kept {} (worker logs, sink.db, server data)",
                self.transport,
                dir.display()
            );
        }
        out
    }
}
