//! Rate limits (Symfony's `rate_limiter` option on a transport): at most `limit` messages per
//! `interval`, shared by every worker of the transport through a bucket in the transport's own
//! server (an SQL row, a Redis key), so 4 workers on 2 hosts together stay under the limit.
//!
//! The bucket is a GCRA token bucket (the "generic cell rate algorithm" of redis-cell and
//! Rails' throttling): one number per bucket, the *theoretical arrival time* `tat` in
//! microseconds of the server's clock. One token is due every `interval / limit` (the emission
//! interval `E`); a take of `n` succeeds while `max(tat, now) + n * E - now <= burst * E`. So
//! over any span of time `t`, at most `burst + limit * t / interval` messages pass; the burst
//! defaults to a tenth of the limit (at least 1), which keeps every full interval within 10 %
//! of the limit and longer spans closer still. A take is one statement or one script: workers
//! on different hosts never race, and "now" is the server's clock, not the hosts'.
//!
//! [`RateLimitGate`] wraps a receiver beside the worker loop (as [`PauseGate`](super::PauseGate)
//! does): before each `get` it takes up to `fetch_size` tokens (at most the burst) and fetches
//! only as many messages as it was granted; with none granted it sleeps until the next token is
//! due (computed from the bucket, no polling loop) and asks again. Messages are fetched only
//! once permitted, so nothing waits held for a token, and a stopping worker drops a gate that
//! is waiting without losing anything. Tokens taken for a fetch that comes back short are not
//! given back: an idle queue's polls spend them, which can only let fewer messages through.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Transport;
use super::gate::{Admission, Gate};
use super::limiter::{MemoryRateLimiter, RateLimit, RateLimiter};
use crate::TransportError;

/// A receiver that fetches only as many messages as its rate limit permits: before each `get`
/// it takes up to that many tokens (at most the burst) from the transport's shared bucket and
/// fetches what it was granted; with none it sleeps until the next token is due. Nothing is
/// fetched before it is permitted, so nothing waits held for a token.
///
/// ```
/// use courier_core::{InMemoryTransport, RateLimit, RateLimitGate, Transport};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let queue: Arc<dyn Transport> = Arc::new(InMemoryTransport::new());
/// let limit = RateLimit::new(50, Duration::from_secs(1)).expect("a positive rate");
/// let gated = RateLimitGate::wrap(queue, limit);
/// // Hand `gated` to `WorkerBuilder::receiver`: every worker of the queue shares the bucket.
/// # let _ = gated;
/// ```
#[derive(Debug)]
pub struct RateLimitGate {
    limit: RateLimit,
    /// Whether the transport's server keeps the bucket.
    shared: bool,
    /// The bucket when it keeps none.
    local: MemoryRateLimiter,
}

impl RateLimitGate {
    /// Wraps `inner` under `limit`: the bucket is the transport's own
    /// ([`Abilities::rate_limiter`](crate::Abilities::rate_limiter)) or, where it keeps none, a process-local one (logged).
    #[must_use]
    pub fn wrap(inner: Arc<dyn Transport>, limit: RateLimit) -> Arc<dyn Transport> {
        let shared = inner.as_rate_limiter().is_some();
        if !shared {
            tracing::warn!(
                messaging.system = inner.messaging_system(),
                "this transport keeps no shared rate-limit bucket: the limit holds per worker process"
            );
        }
        Arc::new(Gate {
            inner,
            admission: Self {
                limit,
                shared,
                local: MemoryRateLimiter::new(),
            },
        })
    }

    fn limiter<'a>(&'a self, inner: &'a dyn Transport) -> &'a dyn RateLimiter {
        match inner.as_rate_limiter() {
            Some(shared) if self.shared => shared,
            _ => &self.local,
        }
    }

    /// Tokens to ask for `max` messages: at most the burst.
    fn want(&self, max: usize) -> u32 {
        u32::try_from(max)
            .unwrap_or(u32::MAX)
            .min(self.limit.burst())
    }
}

#[async_trait]
impl Admission for RateLimitGate {
    async fn now(
        &self,
        inner: &dyn Transport,
        max: usize,
    ) -> Result<Option<usize>, TransportError> {
        let want = self.want(max);
        if want == 0 {
            return Ok(None);
        }
        let taken = self.limiter(inner).take(&self.limit, want).await?;
        Ok((taken.granted > 0).then(|| usize::try_from(taken.granted).unwrap_or(max).min(max)))
    }

    async fn wait(&self, inner: &dyn Transport, max: usize) -> Result<usize, TransportError> {
        let want = self.want(max);
        if want == 0 {
            return Ok(0);
        }
        loop {
            let taken = self.limiter(inner).take(&self.limit, want).await?;
            if taken.granted > 0 {
                return Ok(usize::try_from(taken.granted).unwrap_or(max).min(max));
            }
            // Until the next token is due (at least a millisecond, so a clock that disagrees
            // with the bucket never spins).
            tokio::time::sleep(taken.wait.max(Duration::from_millis(1))).await;
        }
    }

    fn rate_limiter<'a>(&'a self, inner: &'a dyn Transport) -> Option<&'a dyn RateLimiter> {
        Some(self.limiter(inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Envelope;
    use tokio::time::Instant;

    fn fifty() -> RateLimit {
        RateLimit::new(50, Duration::from_secs(1)).unwrap_or_else(|| panic!("valid"))
    }

    #[test]
    fn a_full_bucket_grants_its_burst_then_one_token_per_emission_interval() {
        let limit = fifty();
        let (tat, taken) = limit.take_at(None, 0, 32);
        assert_eq!(taken.granted, 5, "the burst");
        let (tat, taken) = limit.take_at(Some(tat), 0, 32);
        assert_eq!(taken.granted, 0);
        assert_eq!(taken.wait, Duration::from_millis(20), "the next token");
        let (_, taken) = limit.take_at(Some(tat), 20_000, 32);
        assert_eq!(taken.granted, 1);
    }

    #[test]
    fn over_any_span_at_most_burst_plus_rate_pass() {
        let limit = fifty();
        let (mut tat, mut granted, mut now) = (None, 0_u64, 0_i64);
        while now <= 20_000_000 {
            let (next, taken) = limit.take_at(tat, now, 32);
            tat = Some(next);
            granted += u64::from(taken.granted);
            now += 7_000;
        }
        assert!((1000..=1005).contains(&granted), "{granted}");
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct N(u32);
    impl crate::Message for N {
        const NAME: &'static str = "test.n";
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_fetches_no_faster_than_its_limit() {
        let queue = crate::InMemoryTransport::new();
        for i in 0..200 {
            queue
                .send(Envelope::new(N(i)))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let gate = RateLimitGate::wrap(Arc::new(queue), fifty());
        let started = Instant::now();
        let mut got = 0;
        while started.elapsed() < Duration::from_secs(2) {
            got += gate.get(32).await.unwrap_or_else(|e| panic!("{e}")).len();
        }
        // 5 at once, then one per 20 ms for two seconds.
        assert!((100..=106).contains(&got), "{got}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_acks_with_its_fetch_and_never_holds_acks_while_it_waits() {
        let queue = Arc::new(crate::InMemoryTransport::new());
        for i in 0..20 {
            queue
                .send(Envelope::new(N(i)))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let gate = RateLimitGate::wrap(queue.clone(), fifty());
        let first = gate.get(32).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.len(), 5, "the burst");
        // The bucket is empty: the acks go out before the wait for the next token.
        let next = gate
            .ack_and_get(&first, 32)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(next.len(), 1, "one token, one message");
        assert_eq!(queue.acked().len(), 5, "the burst's acks went out");
        let none = gate
            .ack_and_get(&next, 0)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(none.is_empty(), "nothing wanted, nothing fetched");
        assert_eq!(queue.acked().len(), 6, "and the ack went out");
    }
}
