//! The lockstep pipeline: a source read with `get` and acked with `ack_batch` (or both in one
//! round trip, [`Transport::ack_and_get`](crate::Transport::ack_and_get)). While batch `k` is
//! sent, batch `k - 1` (confirmed) is acked and batch `k + 1` fetched; the next step starts
//! once all three are done.

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Forward, Relay, RelayPoint, RelayStats};
use crate::{Envelope, TransportError};

impl Relay {
    /// [`run`](Relay::run) on a source read with `get`: see the [module docs](self).
    pub(super) async fn run_lockstep(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        let mut stats = RelayStats::default();
        let mut next_lag = Instant::now();
        let mut left = self.options.limit.unwrap_or(u64::MAX);
        // Batch k (fetched, sent this step) and batch k - 1 (confirmed, acked this step).
        let (mut sending, mut acking) = (Vec::new(), Vec::new());
        loop {
            let want = self.wanted(left, shutdown);
            if want == 0 && sending.is_empty() && acking.is_empty() {
                return Ok(stats);
            }
            if Instant::now() >= next_lag {
                self.sample_lag().await;
                next_lag = Instant::now() + self.options.lag_every;
            }
            let (sent, next) = tokio::join!(
                self.send(&sending, Forward::Claimed, shutdown),
                self.ack_and_fetch(&acking, want, shutdown),
            );
            let next = next?;
            if !acking.is_empty() {
                self.count(Some(acking.len()), &mut stats);
                self.probe(RelayPoint::AfterDelete).await;
            }
            let retried = sent?;
            if !sending.is_empty() {
                self.probe(RelayPoint::AfterConfirm).await;
            }
            if retried && !next.is_empty() {
                // The send took retries: refresh the batch fetched meanwhile before its turn.
                if let Err(e) = self
                    .bounded("keeping a batch alive", self.from.keepalive_batch(&next))
                    .await
                {
                    tracing::debug!(error = %e, "relay: keepalive of a batch failed");
                }
            }
            left = left.saturating_sub(next.len() as u64);
            acking = std::mem::replace(&mut sending, next);
        }
    }

    /// Acks the confirmed batch `acks` at the source and fetches up to `want` more: in one
    /// round trip where the source can, else side by side. A transient fetch failure once
    /// `shutdown` is cancelled fetches nothing.
    async fn ack_and_fetch(
        &self,
        acks: &[Envelope],
        want: usize,
        shutdown: &CancellationToken,
    ) -> Result<Vec<Envelope>, TransportError> {
        let stopped = |e: TransportError| {
            if e.is_transient() && shutdown.is_cancelled() {
                Ok(Vec::new())
            } else {
                Err(e)
            }
        };
        if acks.is_empty() && want == 0 {
            return Ok(Vec::new());
        }
        if acks.is_empty() {
            return self
                .retrying("fetching", shutdown, |_| {
                    self.bounded("fetching", self.from.get(want))
                })
                .await
                .or_else(stopped);
        }
        if self.from.capabilities().ack_with_get {
            // Acking twice is not an error: a failed attempt is retried with the same acks.
            return self
                .retrying("acking and fetching", shutdown, |_| {
                    self.bounded("acking and fetching", self.from.ack_and_get(acks, want))
                })
                .await;
        }
        let (acked, next) = tokio::join!(
            self.retrying("acking", shutdown, |_| {
                self.bounded("acking", self.from.ack_batch(acks))
            }),
            async {
                if want == 0 {
                    return Ok(Vec::new());
                }
                self.retrying("fetching", shutdown, |_| {
                    self.bounded("fetching", self.from.get(want))
                })
                .await
                .or_else(stopped)
            },
        );
        acked?;
        next
    }
}
