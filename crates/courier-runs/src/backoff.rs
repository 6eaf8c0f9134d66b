//! Requeue backoff: `min(base * 2^count, cap)`, count taken before the increment.

use std::time::Duration;

/// The requeue delay policy (defaults: base 30 s, cap 10 min, no jitter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The longest delay.
    pub cap: Duration,
    /// Fraction in `[0, 1]` taken off at random (0 = exact delays); jitter never lengthens a delay.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(30),
            cap: Duration::from_secs(600),
            jitter: 0.0,
        }
    }
}

impl Backoff {
    /// The delay of the requeue that happens when the run has been requeued `count` times.
    #[must_use]
    pub fn delay(&self, count: u32) -> Duration {
        let factor = 1u32.checked_shl(count.min(31)).unwrap_or(u32::MAX);
        let exact = self.base.saturating_mul(factor).min(self.cap);
        let jitter = self.jitter.clamp(0.0, 1.0);
        if jitter > 0.0 {
            exact.mul_f64(1.0 - jitter * fastrand::f64())
        } else {
            exact
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_base_up_to_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..7).map(|c| b.delay(c).as_secs()).collect();
        assert_eq!(secs, [30, 60, 120, 240, 480, 600, 600]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn jitter_only_shortens() {
        let b = Backoff {
            jitter: 0.5,
            ..Backoff::default()
        };
        for _ in 0..100 {
            let d = b.delay(1);
            assert!(
                d <= Duration::from_secs(60) && d >= Duration::from_secs(30),
                "{d:?}"
            );
        }
    }
}
