//! The one exponential backoff: retry delays, the worker's wait after a failed `get`, the run
//! requeue delay and every reconnect loop use [`Backoff`].

use std::time::Duration;

/// Exponential backoff with jitter: attempt `n` (counted from 0) waits
/// `base * multiplier^n`, capped at `cap`, then spread by [`Jitter`] and capped again.
/// Arithmetic saturates: no attempt number, multiplier or jitter overflows or panics.
///
/// ```
/// use courier_core::{Backoff, Jitter};
/// use std::time::Duration;
///
/// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// let waits: Vec<u64> = (0..6).map(|n| backoff.delay(n).as_millis() as u64).collect();
/// assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
/// assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(1));
///
/// // The state form: count failures, reset on success.
/// let mut attempts = backoff.multiplier(3.0).attempts();
/// assert_eq!(attempts.failed(), Duration::from_millis(100));
/// assert_eq!(attempts.failed(), Duration::from_millis(300));
/// attempts.succeeded();
/// assert_eq!(attempts.failed(), Duration::from_millis(100));
///
/// // Jitter that only shortens: every wait of attempt 2 lies in 200..=400 ms.
/// let jittered = backoff.jitter(Jitter::Shorten(0.5));
/// let d = jittered.delay(2);
/// assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The wait of the first attempt (attempt 0).
    pub base: Duration,
    /// The growth per attempt; values below 1 (and NaN) count as 1.
    pub multiplier: f64,
    /// The longest wait, jitter included ([`Duration::MAX`]: no cap).
    pub cap: Duration,
    /// The random spread applied to each wait.
    pub jitter: Jitter,
}

/// The random spread of a [`Backoff`] wait. Fractions are clamped to `0..=1` (NaN counts as 0).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Jitter {
    /// Exact waits.
    #[default]
    None,
    /// The wait times a random factor in `[1 - f, 1 + f]` (0.1 = +-10 %), still capped.
    Spread(f64),
    /// The wait times a random factor in `[1 - f, 1]`: jitter never lengthens a wait.
    Shorten(f64),
}

impl Jitter {
    /// The random factor to multiply an exact wait by.
    fn factor(self) -> f64 {
        let clamp = |f: f64| if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
        match self {
            Self::None => 1.0,
            Self::Spread(f) => 1.0 + clamp(f) * (fastrand::f64() * 2.0 - 1.0),
            Self::Shorten(f) => 1.0 - clamp(f) * fastrand::f64(),
        }
    }
}

impl Default for Backoff {
    /// 100 ms doubling up to 30 s, no jitter.
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

impl Backoff {
    /// Starts at `base`, doubles, stops growing at `cap`; no jitter.
    #[must_use]
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            multiplier: 2.0,
            cap,
            jitter: Jitter::None,
        }
    }

    /// Sets the growth per attempt.
    #[must_use]
    pub const fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// Sets the longest wait.
    #[must_use]
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Sets the jitter.
    #[must_use]
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The wait of attempt `attempt` (from 0) without jitter: `base * multiplier^attempt`,
    /// capped.
    #[must_use]
    pub fn exact(&self, attempt: u32) -> Duration {
        let multiplier = if self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let factor = multiplier.powi(i32::try_from(attempt).unwrap_or(i32::MAX));
        let wait = if factor.fract() == 0.0 && factor <= f64::from(u32::MAX) {
            // Whole factors (doubling) stay exact in integer arithmetic.
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a whole number in 1..=u32::MAX"
            )]
            let whole = factor as u32;
            self.base.saturating_mul(whole)
        } else {
            Duration::try_from_secs_f64(self.base.as_secs_f64() * factor).unwrap_or(Duration::MAX)
        };
        wait.min(self.cap)
    }

    /// The wait of attempt `attempt` (from 0), jitter applied, never above `cap`.
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let exact = self.exact(attempt);
        if self.jitter == Jitter::None {
            return exact;
        }
        Duration::try_from_secs_f64(exact.as_secs_f64() * self.jitter.factor())
            .unwrap_or(exact)
            .min(self.cap)
    }

    /// A failure counter that hands out this backoff's waits in turn.
    #[must_use]
    pub const fn attempts(self) -> Attempts {
        Attempts {
            backoff: self,
            failures: 0,
        }
    }
}

/// The state form of a [`Backoff`]: counts consecutive failures. Also an endless iterator of
/// waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attempts {
    backoff: Backoff,
    failures: u32,
}

impl Attempts {
    /// Records a failure; the wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let wait = self.backoff.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        wait
    }

    /// Records a success: the next failure waits `base` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// The failures since the last success.
    #[must_use]
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    /// The backoff handing out the waits.
    #[must_use]
    pub const fn backoff(&self) -> &Backoff {
        &self.backoff
    }
}

impl Iterator for Attempts {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.failed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_base_up_to_cap() {
        let b = Backoff::new(MS * 50, MS * 2000);
        let ms: Vec<u128> = (0..9).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    #[test]
    fn huge_attempts_multipliers_and_bases_saturate_at_the_cap() {
        let b = Backoff::new(Duration::from_secs(30), Duration::from_secs(600));
        for n in [31, 32, 64, 1000, u32::MAX] {
            assert_eq!(b.delay(n), Duration::from_secs(600), "attempt {n}");
        }
        let uncapped = Backoff::new(Duration::MAX, Duration::MAX).multiplier(1e300);
        assert_eq!(uncapped.delay(u32::MAX), Duration::MAX);
        let fractional = Backoff::new(MS, Duration::MAX).multiplier(1.5);
        assert_eq!(fractional.delay(u32::MAX), Duration::MAX);
        assert_eq!(fractional.delay(2), Duration::from_micros(2250));
    }

    #[test]
    fn a_multiplier_below_one_or_nan_keeps_the_base() {
        for m in [0.0, 0.5, -3.0, f64::NAN] {
            let b = Backoff::new(MS * 10, MS * 100).multiplier(m);
            assert_eq!(b.delay(5), MS * 10, "multiplier {m}");
        }
    }

    #[test]
    fn a_base_above_the_cap_waits_the_cap() {
        assert_eq!(Backoff::new(MS * 10, MS * 5).delay(0), MS * 5);
    }

    #[test]
    fn spread_jitter_stays_within_its_fraction_and_the_cap() {
        let b = Backoff::new(MS * 1000, MS * 1050).jitter(Jitter::Spread(0.1));
        let (mut low, mut high) = (false, false);
        for _ in 0..1000 {
            let d = b.delay(0);
            assert!(d >= MS * 900 && d <= MS * 1050, "{d:?}");
            low |= d < MS * 950;
            high |= d > MS * 1000;
        }
        assert!(low && high, "the spread goes both ways");
    }

    #[test]
    fn shorten_jitter_never_lengthens() {
        let b = Backoff::new(MS * 30, MS * 600).jitter(Jitter::Shorten(0.5));
        for _ in 0..1000 {
            let d = b.delay(1);
            assert!(d >= MS * 30 && d <= MS * 60, "{d:?}");
        }
    }

    #[test]
    fn out_of_range_jitter_is_clamped() {
        let b = Backoff::new(MS * 100, MS * 100).jitter(Jitter::Spread(7.0));
        for _ in 0..200 {
            assert!(b.delay(0) <= MS * 100);
        }
        let b = Backoff::new(MS * 100, MS * 100).jitter(Jitter::Shorten(f64::NAN));
        assert_eq!(b.delay(0), MS * 100);
        let b = Backoff::new(MS * 100, Duration::MAX).jitter(Jitter::Shorten(-1.0));
        assert_eq!(b.delay(0), MS * 100);
    }

    #[test]
    fn attempts_count_failures_and_reset_on_success() {
        let mut a = Backoff::new(MS * 500, MS * 30_000).attempts();
        let secs: Vec<f64> = a.by_ref().take(9).map(|d| d.as_secs_f64()).collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
        assert_eq!(a.failures(), 9);
        a.succeeded();
        assert_eq!(a.failures(), 0);
        assert_eq!(a.failed(), MS * 500);
    }
}
