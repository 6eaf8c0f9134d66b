//! `consume`'s progress: counters fed by the worker's events, shown as one live status line on
//! a terminal (rewritten four times a second: rate, handled, failed, in flight, and the same per
//! transport) and as a plain log line every 10 s otherwise (only when something changed).

use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier_core::CancellationToken;

/// Counts of one transport.
#[derive(Debug, Default)]
pub(crate) struct PerTransport {
    pub(crate) received: AtomicU64,
    pub(crate) handled: AtomicU64,
    pub(crate) failed: AtomicU64,
}

impl PerTransport {
    fn in_flight(&self) -> u64 {
        let finished = self.handled.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed);
        self.received
            .load(Ordering::Relaxed)
            .saturating_sub(finished)
    }
}

/// Counters the progress line reads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) received: AtomicU64,
    pub(crate) handled: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) moved: AtomicU64,
    /// Per transport, every one of the configuration (fixed at start: no lock to count).
    pub(crate) per: BTreeMap<String, PerTransport>,
}

impl Counters {
    pub(crate) fn new(transports: impl IntoIterator<Item = String>) -> Self {
        Self {
            per: transports
                .into_iter()
                .map(|t| (t, PerTransport::default()))
                .collect(),
            ..Self::default()
        }
    }

    pub(crate) fn of(&self, transport: &str) -> Option<&PerTransport> {
        self.per.get(transport)
    }

    /// Messages received and not finished (handled or failed): what a forced exit leaves for
    /// redelivery.
    pub(crate) fn in_flight(&self) -> u64 {
        let finished = self.handled.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed);
        self.received
            .load(Ordering::Relaxed)
            .saturating_sub(finished)
    }

    /// The status line: totals, then each transport that received anything.
    fn line(&self, rate: f64) -> String {
        let mut line = format!(
            "{rate:.0}/s  handled {}  failed {}  in flight {}",
            self.handled.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.in_flight(),
        );
        let retried = self.retried.load(Ordering::Relaxed);
        let moved = self.moved.load(Ordering::Relaxed);
        if retried + moved > 0 {
            line.push_str(&format!("  retried {retried}  to failure {moved}"));
        }
        let active: Vec<String> = self
            .per
            .iter()
            .filter(|(_, c)| c.received.load(Ordering::Relaxed) > 0)
            .map(|(name, c)| {
                format!(
                    "{name} {}/{}/{}",
                    c.handled.load(Ordering::Relaxed),
                    c.failed.load(Ordering::Relaxed),
                    c.in_flight()
                )
            })
            .collect();
        if active.len() > 1 || (active.len() == 1 && self.per.len() > 1) {
            line.push_str(" | ");
            line.push_str(&active.join("  "));
        }
        line
    }
}

/// The rate over the last two seconds of samples.
struct Rate {
    samples: VecDeque<(Instant, u64)>,
}

impl Rate {
    const WINDOW: Duration = Duration::from_secs(2);

    fn new() -> Self {
        Self {
            samples: VecDeque::from([(Instant::now(), 0)]),
        }
    }

    fn push(&mut self, at: Instant, done: u64) -> f64 {
        self.samples.push_back((at, done));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > Self::WINDOW)
            && self.samples.len() > 2
        {
            self.samples.pop_front();
        }
        let Some(&(t0, n0)) = self.samples.front() else {
            return 0.0;
        };
        let secs = at.duration_since(t0).as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            done.saturating_sub(n0) as f64 / secs
        }
    }
}

/// The width the terminal line is cut to: `$COLUMNS`, else 80.
fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w: &usize| *w >= 20)
        .unwrap_or(crate::table::WIDTH)
}

/// A live status line on a terminal, a log line every 10 s otherwise, until `done`.
pub(crate) async fn progress(c: Arc<Counters>, done: CancellationToken) {
    let tty = std::io::stderr().is_terminal();
    let period = if tty {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(10)
    };
    let width = width().saturating_sub(1);
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    let mut rate = Rate::new();
    let mut last = u64::MAX;
    loop {
        let finished = tokio::select! {
            _ = tick.tick() => false,
            () = done.cancelled() => true,
        };
        let settled = c.handled.load(Ordering::Relaxed) + c.failed.load(Ordering::Relaxed);
        let per_s = rate.push(Instant::now(), settled);
        let line = c.line(per_s);
        if tty {
            eprint!("\r\x1b[2K{}", crate::table::shorten(&line, width));
            if finished {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        } else if settled != last && !finished {
            eprintln!("{line}");
        }
        last = settled;
        if finished {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_in_flight_and_each_busy_transport() {
        let c = Counters::new(["async".to_owned(), "low".to_owned(), "idle".to_owned()]);
        for (name, received, handled, failed) in [("async", 5, 3, 1), ("low", 2, 2, 0)] {
            let t = c.of(name).unwrap_or_else(|| panic!("{name} is counted"));
            t.received.store(received, Ordering::Relaxed);
            t.handled.store(handled, Ordering::Relaxed);
            t.failed.store(failed, Ordering::Relaxed);
        }
        c.received.store(7, Ordering::Relaxed);
        c.handled.store(5, Ordering::Relaxed);
        c.failed.store(1, Ordering::Relaxed);
        let line = c.line(12.4);
        assert_eq!(
            line,
            "12/s  handled 5  failed 1  in flight 1 | async 3/1/1  low 2/0/0"
        );
    }

    #[test]
    fn the_rate_counts_the_last_two_seconds() {
        let mut r = Rate::new();
        let t0 = Instant::now();
        r.push(t0, 0);
        let one = r.push(t0 + Duration::from_secs(1), 100);
        assert!((90.0..=110.0).contains(&one), "{one}");
        r.push(t0 + Duration::from_secs(3), 100);
        let idle = r.push(t0 + Duration::from_secs(5), 100);
        assert!(idle < 1.0, "no progress for two seconds: {idle}");
    }
}
