//! Machine-wide CPU time spent over one phase of a bench, read from Linux's `/proc/stat`.
//!
//! A bench whose servers run on the same machine as Courier (as here, and on most laptops)
//! measures throughput with every process competing for the same cores: when the machine is
//! busy, a phase's rate is set by the CPU time it costs per message, summed over the client,
//! the database and the broker. This meter reports that cost, so a ratio between two phases
//! can be read as a CPU budget: a phase that must reach 0.8x another's rate on a saturated
//! machine may spend at most 1.25x its CPU per message.
//!
//! Counted in the kernel's `USER_HZ` ticks (1/100 s on every mainstream Linux build), so a
//! phase needs a few tenths of a second for the figure to mean anything: the bench's default
//! 20,000 messages give ~10-50 ticks per phase. It counts every process on the machine, a
//! concurrent build too. Elsewhere than Linux there is no figure (`None`).
//!
//! Beside it, the bench's own process's share (`/proc/self/stat`): what Courier itself spent,
//! so the rest is the servers' (and anything else running).

use std::time::{Duration, Instant};

/// Ticks per second of `/proc/stat`'s counters (`USER_HZ`).
const TICKS_PER_SECOND: u64 = 100;

/// The machine's CPU counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuClock {
    /// Ticks spent running anything (every state but idle and iowait), summed over the cores.
    busy: u64,
    /// Ticks this process spent (user and system).
    own: u64,
    at: Instant,
}

/// CPU time spent over a phase, machine-wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CpuSpent {
    /// Busy time summed over the cores.
    pub(crate) busy: Duration,
    /// This process's share of `busy`.
    pub(crate) own: Duration,
    /// Wall time of the phase.
    pub(crate) wall: Duration,
}

impl CpuSpent {
    /// CPU microseconds per message.
    pub(crate) fn micros_per(&self, messages: u64) -> f64 {
        self.busy.as_secs_f64() * 1e6 / messages.max(1) as f64
    }

    /// This process's CPU microseconds per message.
    pub(crate) fn own_micros_per(&self, messages: u64) -> f64 {
        self.own.as_secs_f64() * 1e6 / messages.max(1) as f64
    }

    /// How many cores were busy on average.
    pub(crate) fn cores(&self) -> f64 {
        self.busy.as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }
}

impl CpuClock {
    /// The counters now; `None` where `/proc/stat` is missing (not Linux) or unreadable.
    pub(crate) fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Some(Self {
            busy: busy_ticks(&stat)?,
            own: own_ticks(&own)?,
            at: Instant::now(),
        })
    }

    /// What the machine spent since `self`; `None` if the counters cannot be read now.
    pub(crate) fn spent(&self) -> Option<CpuSpent> {
        let now = Self::now()?;
        let ticks = |now: u64, then: u64| {
            Duration::from_millis(now.saturating_sub(then) * 1000 / TICKS_PER_SECOND)
        };
        Some(CpuSpent {
            busy: ticks(now.busy, self.busy),
            own: ticks(now.own, self.own),
            wall: now.at.duration_since(self.at),
        })
    }
}

/// The busy ticks of the aggregate `cpu` line: user, nice, system, irq, softirq and steal
/// (guest time is already counted in user and nice); idle and iowait are not busy.
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal] = fields[..] else {
        return None;
    };
    Some(user + nice + system + irq + softirq + steal)
}

/// A process's user and system ticks from its `/proc/<pid>/stat` line: the 14th and 15th
/// fields, counted after the command name's closing parenthesis (the name may hold spaces).
fn own_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  100 2 30 5000 40 5 6 7 9 0\ncpu0 50 1 15 2500 20 2 3 3 4 0\nintr 1 2\n";
        assert_eq!(busy_ticks(stat), Some(100 + 2 + 30 + 5 + 6 + 7));
    }

    #[test]
    fn a_stat_without_the_aggregate_line_or_with_garbage_gives_no_figure() {
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks("cpu  1 2 3\n"), None);
    }

    #[test]
    fn own_ticks_are_user_plus_system_after_the_command_name() {
        let stat = "4242 (my (odd) bin) S 1 4242 4242 0 -1 4194560 900 0 0 0 120 34 0 0 20 0 3 0";
        assert_eq!(own_ticks(stat), Some(120 + 34));
        assert_eq!(own_ticks("4242 (bin) S 1 2"), None);
        assert_eq!(own_ticks("no parenthesis"), None);
    }

    #[test]
    fn spent_time_reads_as_microseconds_per_message_and_busy_cores() {
        let spent = CpuSpent {
            busy: Duration::from_millis(300),
            own: Duration::from_millis(100),
            wall: Duration::from_millis(200),
        };
        assert!((spent.micros_per(20_000) - 15.0).abs() < 1e-9);
        assert!((spent.cores() - 1.5).abs() < 1e-9);
        assert!((spent.own_micros_per(20_000) - 5.0).abs() < 1e-9);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_clock_counts_a_busy_core() {
        // Spins until the clock has counted 100 ms of this process's CPU time: on a loaded
        // machine the spinning thread gets only a share of a core, so the spin is bounded by
        // what was counted (and, for a clock that never counts, by 20 s of wall time), not by
        // a wall-clock guess.
        let clock = CpuClock::now().expect("/proc/stat");
        let started = Instant::now();
        let mut spins = 0_u64;
        let spent = loop {
            for _ in 0..100_000 {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
            let spent = clock.spent().expect("/proc/stat");
            if spent.own >= Duration::from_millis(100)
                || started.elapsed() > Duration::from_secs(20)
            {
                break spent;
            }
        };
        assert!(
            spent.own >= Duration::from_millis(100),
            "20 s spinning in this process counted only {spent:?}"
        );
        // The machine's busy time includes this process's, give or take the ticks between
        // reading `/proc/stat` and `/proc/self/stat` (and the other tests' threads, counted
        // in this process's time too).
        assert!(
            spent.busy + Duration::from_millis(50) >= spent.own,
            "the machine's busy time includes this process's: {spent:?}"
        );
    }
}
