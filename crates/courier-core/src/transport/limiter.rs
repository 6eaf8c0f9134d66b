//! Rate-limit buckets: the [`RateLimit`] itself, the [`RateLimiter`] a transport's server
//! keeps them in, and the process-local [`MemoryRateLimiter`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::TransportError;

/// A rate limit: at most `limit` messages per `interval`, in bursts of at most `burst`.
///
/// A GCRA token bucket: a token is due every `interval / limit`, at most `burst` at once, so
/// over any span `t` at most `burst + limit * t / interval` messages pass.
///
/// ```
/// use courier_core::RateLimit;
/// use std::time::Duration;
///
/// let limit = RateLimit::new(50, Duration::from_secs(1)).expect("a positive rate");
/// assert_eq!(limit.burst(), 5);
/// assert_eq!(limit.emission_interval(), Duration::from_millis(20));
/// assert!(RateLimit::new(0, Duration::from_secs(1)).is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    limit: u32,
    interval: Duration,
    burst: u32,
}

impl RateLimit {
    /// `limit` messages per `interval`, bursts of a tenth of the limit (at least 1); `None`
    /// when either is zero.
    #[must_use]
    pub fn new(limit: u32, interval: Duration) -> Option<Self> {
        (limit > 0 && !interval.is_zero()).then(|| Self {
            limit,
            interval,
            burst: limit.div_ceil(10),
        })
    }

    /// Sets the largest burst (clamped to `1..=limit`).
    #[must_use]
    pub fn with_burst(mut self, burst: u32) -> Self {
        self.burst = burst.clamp(1, self.limit);
        self
    }

    /// Messages per interval.
    #[must_use]
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The interval.
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The largest burst: the most messages one take (and one fetch) may get at once.
    #[must_use]
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// How often a token is due: `interval / limit`, rounded up to the microsecond.
    #[must_use]
    pub fn emission_interval(&self) -> Duration {
        Duration::from_micros(self.emission_us().unsigned_abs())
    }

    /// [`RateLimit::emission_interval`] in microseconds (at least 1), the unit of the buckets.
    #[must_use]
    pub fn emission_us(&self) -> i64 {
        let interval = i64::try_from(self.interval.as_micros()).unwrap_or(i64::MAX / 4);
        (interval.saturating_add(i64::from(self.limit) - 1) / i64::from(self.limit)).max(1)
    }

    /// `burst * E` in microseconds: how far ahead of now a bucket's `tat` may run.
    #[must_use]
    pub fn tolerance_us(&self) -> i64 {
        self.emission_us().saturating_mul(i64::from(self.burst))
    }

    /// One take of up to `want` tokens from a bucket at `tat` (microseconds, `None`: a new,
    /// full bucket) when the clock says `now`: the bucket's new `tat` and what was taken. The
    /// server-side takes (SQL, Lua) compute the same.
    #[must_use]
    pub fn take_at(&self, tat: Option<i64>, now: i64, want: u32) -> (i64, Taken) {
        let e = self.emission_us();
        let base = tat.unwrap_or(now).max(now);
        let room = (now + self.tolerance_us() - base).div_euclid(e).max(0);
        let granted = room.min(i64::from(want));
        let tat = base + granted * e;
        (tat, self.taken(tat, now, granted))
    }

    /// What a take that left the bucket at `tat` when the clock said `now` and granted
    /// `granted` tokens means: with none granted, how long until the next token is due.
    #[must_use]
    pub fn taken(&self, tat: i64, now: i64, granted: i64) -> Taken {
        let granted = u32::try_from(granted.max(0)).unwrap_or(u32::MAX);
        let wait = if granted == 0 {
            // A token is due once `tat + E - now <= burst * E`.
            let us = tat + self.emission_us() - now - self.tolerance_us();
            Duration::from_micros(us.max(0).unsigned_abs())
        } else {
            Duration::ZERO
        };
        Taken { granted, wait }
    }
}

/// What one take got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Tokens granted (messages that may be fetched now).
    pub granted: u32,
    /// With none granted: how long until the next token is due.
    pub wait: Duration,
}

/// A transport whose server keeps rate-limit buckets shared by every worker of its queue.
#[async_trait]
pub trait RateLimiter: Send + Sync {
    /// Takes up to `want` tokens of this queue's bucket under `limit`, atomically (one
    /// statement or script, on the server's clock).
    async fn take(&self, limit: &RateLimit, want: u32) -> Result<Taken, TransportError>;
}

const _: () = {
    fn _obj_safe(_: &dyn RateLimiter) {}
};

/// A process-local bucket on tokio's clock: the in-memory transport's, and the fallback of
/// transports whose server keeps none (AMQP), where the limit holds per worker process.
#[derive(Debug, Clone)]
pub struct MemoryRateLimiter {
    epoch: Instant,
    tat: Arc<Mutex<Option<i64>>>,
}

impl Default for MemoryRateLimiter {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            tat: Arc::default(),
        }
    }
}

impl MemoryRateLimiter {
    /// A full bucket (clones share it).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl RateLimiter for MemoryRateLimiter {
    async fn take(&self, limit: &RateLimit, want: u32) -> Result<Taken, TransportError> {
        let now = i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX / 4);
        let mut tat = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, taken) = limit.take_at(*tat, now, want);
        *tat = Some(next);
        Ok(taken)
    }
}
