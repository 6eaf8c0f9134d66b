//! The cursor pipeline: a source read by a cursor ([`CursorSource`]: SQL on PostgreSQL with
//! `cursor=true`), which writes nothing as it reads and removes what was relayed as one range
//! when the cursor moves past it.

use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Relay, RelayPoint, RelayStats};
use crate::{CursorLease, CursorPosition, CursorSource, TransportError};

/// How often a relay waiting for a cursor another holds tries to take it.
const CURSOR_RETAKE: Duration = Duration::from_secs(2);

impl Relay {
    /// [`run`](Self::run) on a source read by a cursor ([`CursorSource`]: SQL on PostgreSQL
    /// with `cursor=true`). Takes the source's cursor (waiting while another relay holds it),
    /// then pipelines like [`run`](Self::run): while batch `k` is sent, the cursor moves past
    /// batch `k - 1` (confirmed; the source removes its messages) and batch `k + 1` is read;
    /// the lease is renewed meanwhile. A relay whose lease broke (its session to the source
    /// ended) takes the cursor again and goes on from where it stands, sending again what it
    /// had sent past it (at least once).
    pub(super) async fn run_cursor(
        &self,
        source: &dyn CursorSource,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        let owner = crate::worker::default_worker_id();
        let mut stats = RelayStats::default();
        let mut left = self.options.limit.unwrap_or(u64::MAX);
        let mut waits = self.options.backoff.attempts();
        loop {
            if self.wanted(left, shutdown) == 0 {
                return Ok(stats);
            }
            let Some(lease) = self.take_cursor(source, &owner, shutdown).await? else {
                return Ok(stats);
            };
            let before = stats.relayed;
            let lost = match self
                .cursor_pipeline(source, lease, shutdown, &mut left, &mut stats)
                .await?
            {
                None => return Ok(stats),
                Some(lost) => lost,
            };
            if stats.relayed > before {
                waits.succeeded();
            }
            if shutdown.is_cancelled() {
                return Err(lost);
            }
            self.wait("holding the cursor", &lost, &mut waits, shutdown)
                .await;
        }
    }

    /// Takes the cursor of `source`, waiting while another relay holds it; `None` once shut
    /// down meanwhile.
    async fn take_cursor(
        &self,
        source: &dyn CursorSource,
        owner: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Box<dyn CursorLease>>, TransportError> {
        let lease = self.hold_bound();
        let mut told = false;
        loop {
            let taken = self
                .retrying("taking the cursor", shutdown, |_| {
                    self.bounded("taking the cursor", source.acquire(owner, lease))
                })
                .await;
            match taken {
                Ok(Some(held)) => {
                    if told {
                        tracing::info!(from = %self.from_name, to = %self.to_name, "relay: took the outbox's cursor");
                    }
                    return Ok(Some(held));
                }
                Ok(None) => {}
                Err(e) if e.is_transient() && shutdown.is_cancelled() => return Ok(None),
                Err(e) => return Err(e),
            }
            if !told {
                told = true;
                tracing::info!(from = %self.from_name, to = %self.to_name,
                    "relay: another relay holds the outbox's cursor; waiting until it lets go");
            }
            tokio::select! {
                () = tokio::time::sleep(CURSOR_RETAKE.min(lease)) => {}
                () = shutdown.cancelled() => return Ok(None),
            }
        }
    }

    /// The stages of [`run_cursor`](Self::run_cursor) under `lease`, until every message
    /// asked for is relayed or shut down (`None`), or the lease failed (the error: the cursor
    /// is taken again).
    async fn cursor_pipeline(
        &self,
        source: &dyn CursorSource,
        mut lease: Box<dyn CursorLease>,
        shutdown: &CancellationToken,
        left: &mut u64,
        stats: &mut RelayStats,
    ) -> Result<Option<TransportError>, TransportError> {
        let renew_every = self.hold_bound() / 4;
        let mut next_lag = Instant::now();
        // Batch k (read, sent this step) with the position just after it, and batch k - 1
        // (confirmed: the cursor moves past it this step).
        let (mut sending, mut sent_to) = (Vec::new(), lease.position());
        let mut confirmed: Option<(usize, CursorPosition)> = None;
        loop {
            let want = self.wanted(*left, shutdown);
            if want == 0 && sending.is_empty() && confirmed.is_none() {
                return Ok(None);
            }
            if Instant::now() >= next_lag {
                self.sample_lag().await;
                next_lag = Instant::now() + self.options.lag_every;
            }
            let stage_done = Notify::new();
            let (moved, (sent, next)) = tokio::join!(
                async {
                    // The move first, then renewals until the rest of the stage is done (a
                    // send may wait out a destination outage): the lease never lapses while
                    // this relay is alive and can reach the source.
                    if let Some((_, to)) = confirmed {
                        self.bounded("moving the cursor", lease.advance(to)).await?;
                    }
                    loop {
                        tokio::select! {
                            () = stage_done.notified() => return Ok::<_, TransportError>(()),
                            () = tokio::time::sleep(renew_every) => {
                                self.bounded("renewing the cursor's lease", lease.renew()).await?;
                            }
                        }
                    }
                },
                async {
                    let done = tokio::join!(self.send(&sending, false, true, shutdown), async {
                        if want == 0 {
                            return Ok((Vec::new(), sent_to));
                        }
                        self.retrying("reading", shutdown, |_| {
                            self.bounded("reading", source.read(sent_to, want))
                        })
                        .await
                        .or_else(|e| {
                            if e.is_transient() && shutdown.is_cancelled() {
                                Ok((Vec::new(), sent_to))
                            } else {
                                Err(e)
                            }
                        })
                    },);
                    stage_done.notify_one();
                    done
                },
            );
            if let Err(e) = moved {
                if !e.is_transient() {
                    return Err(e);
                }
                // The lease broke: what was sent since the last move is sent again from where
                // the cursor stands, by this relay once it holds it again, or by another.
                tracing::warn!(from = %self.from_name, to = %self.to_name, error = %crate::error_chain(&e),
                    "relay: the outbox's cursor lease failed; taking the cursor again");
                let unmoved = confirmed.map_or(0, |(n, _)| n) + sending.len();
                *left = left.saturating_add(unmoved as u64);
                return Ok(Some(e));
            }
            if let Some((n, _)) = confirmed.take() {
                self.count(Some(n), stats);
                self.probe(RelayPoint::AfterDelete).await;
            }
            sent?;
            if !sending.is_empty() {
                self.probe(RelayPoint::AfterConfirm).await;
                confirmed = Some((sending.len(), sent_to));
            }
            let (next, to) = next?;
            *left = left.saturating_sub(next.len() as u64);
            (sending, sent_to) = (next, to);
        }
    }
}
