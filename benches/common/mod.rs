//! Paired rounds for the transport benches: the raw driver loop and Courier run back to back in
//! each round, the order alternating from round to round, so that drift on a busy machine (page
//! cache, WAL growth, another process) hits both sides alike. The figure reported for a pattern
//! is the median of its per-round ratios, with the median rates of both sides beside it.

use std::collections::BTreeMap;
use std::time::Duration;

/// Rounds to run: `COURIER_BENCH_ROUNDS`, default 9.
pub(crate) fn rounds() -> usize {
    std::env::var("COURIER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(9)
}

/// Messages/s of N messages in `elapsed`.
pub(crate) fn rate(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Per-pattern (raw, courier) rates, one pair per round.
#[derive(Default)]
pub(crate) struct Paired {
    rounds: BTreeMap<String, Vec<(f64, f64)>>,
}

impl Paired {
    /// Records one round of a pattern.
    pub(crate) fn add(&mut self, pattern: &str, raw: f64, courier: f64) {
        self.rounds
            .entry(pattern.to_owned())
            .or_default()
            .push((raw, courier));
    }

    /// Prints one line per pattern: median rates, median ratio and the ratio's range.
    pub(crate) fn print(&self, title: &str) {
        println!("\n{title}");
        println!(
            "{:<30} {:>12} {:>12} {:>7}  {:>13}  rounds",
            "pattern", "raw msg/s", "courier", "ratio", "ratio range"
        );
        for (pattern, pairs) in &self.rounds {
            let mut raw: Vec<f64> = pairs.iter().map(|p| p.0).collect();
            let mut courier: Vec<f64> = pairs.iter().map(|p| p.1).collect();
            let mut ratio: Vec<f64> = pairs.iter().map(|p| p.1 / p.0).collect();
            let (lo, hi) = ratio
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
            println!(
                "{pattern:<30} {:>12.0} {:>12.0} {:>6.2}x  {lo:>5.2} - {hi:<5.2}  {}",
                median(&mut raw),
                median(&mut courier),
                median(&mut ratio),
                pairs.len()
            );
        }
    }
}

/// The median (mean of the middle two for an even count); 0 for none.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}
