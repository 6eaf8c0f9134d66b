//! What both sides of a benchmark are asked to do and what they measured: the figures
//! `courier bench` reports for Courier and for the raw driver alike, and how they are computed.

use std::time::Duration;

use serde::Serialize;

/// Throughput and latency of one implementation.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Figures {
    /// Messages sent per second.
    pub produce_per_s: f64,
    /// Messages consumed (claimed, decoded, acknowledged) per second.
    pub consume_per_s: f64,
    /// The median send -> handler latency, in milliseconds.
    pub p50_ms: f64,
    /// The 99th percentile send -> handler latency, in milliseconds.
    pub p99_ms: f64,
}

/// What the raw driver is asked to do.
#[derive(Debug, Clone)]
pub struct Work {
    /// Messages sent, then consumed.
    pub messages: u64,
    /// Bytes of each message's payload.
    pub size: usize,
    /// Messages per batch sent and per claim.
    pub fetch_size: usize,
    /// Latency samples taken after the throughput part.
    pub latency_samples: usize,
}

/// A payload of `size` bytes of JSON-safe text.
#[must_use]
pub fn payload(size: usize) -> String {
    "x".repeat(size)
}

/// `n` per second over `elapsed`.
#[must_use]
pub fn per_second(n: u64, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// p50 and p99 in milliseconds.
pub fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_nearest_ranks_in_milliseconds() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let (p50, p99) = percentiles(&mut samples);
        assert!(
            (p50 - 50.0).abs() < 1e-9 && (p99 - 99.0).abs() < 1e-9,
            "{p50} {p99}"
        );
        assert_eq!(percentiles(&mut []), (0.0, 0.0));
    }

    #[test]
    fn a_rate_over_no_time_is_finite() {
        assert!((per_second(500, Duration::from_millis(250)) - 2000.0).abs() < 1e-9);
        assert!(per_second(1, Duration::ZERO).is_finite());
        assert_eq!(payload(3), "xxx");
    }
}
