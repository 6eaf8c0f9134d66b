//! What a running worker counts, and the limits that stop it.

use tokio::time::Instant;

use super::{StopReason, Worker, WorkerStats};

/// The counts and the stop of one [`Worker::run`].
pub(super) struct RunState {
    pub(super) stats: WorkerStats,
    pub(super) started: Instant,
    pub(super) error_backoff: crate::Attempts,
    pub(super) stop: Option<StopReason>,
}

impl Worker {
    /// The limit reached, if any (messages, failures, time, memory).
    pub(super) fn limit_reached(&self, state: &RunState) -> Option<StopReason> {
        let o = &self.options;
        if o.limit.is_some_and(|l| state.stats.received >= l) {
            return Some(StopReason::MessageLimit);
        }
        if o.failure_limit.is_some_and(|l| state.stats.failed >= l) {
            return Some(StopReason::FailureLimit);
        }
        if o.time_limit.is_some_and(|t| state.started.elapsed() >= t) {
            return Some(StopReason::TimeLimit);
        }
        if o.memory_limit
            .is_some_and(|m| resident_memory().is_some_and(|rss| rss > m))
        {
            return Some(StopReason::MemoryLimit);
        }
        None
    }
}

/// Resident set size in bytes, if known: Linux's `VmRSS` line of `/proc/self/status`, in kB
/// whatever the page size (`/proc/self/statm` counts pages, 4 KiB on x86-64 but 16 or 64 KiB
/// on some arm64 kernels).
fn resident_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    vm_rss(&status)
}

/// The `VmRSS:   1234 kB` line of a `/proc/PID/status` text, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next()? {
        "kB" => 1024,
        "mB" | "MB" => 1024 * 1024,
        "B" => 1,
        _ => return None,
    };
    value.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_in_bytes_from_vm_rss() {
        let status = "Name:\tcourier\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(vm_rss(status), Some(12345 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None);
        assert_eq!(vm_rss("VmRSS:\t  oops kB\n"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn resident_memory_is_the_size_of_a_running_test_process() {
        // A test binary's threads and heap hold megabytes; read as pages of an assumed 4 KiB on
        // a 64 KiB-page kernel it would be a sixteenth of that.
        let rss = resident_memory().unwrap_or(0);
        assert!(
            (2 << 20..64 << 30).contains(&rss),
            "a test process holds 2 MiB to 64 GiB: {rss} B"
        );
    }
}
