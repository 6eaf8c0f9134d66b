//! Reading an outbox by a cursor ([`CursorSource`]: SQL on PostgreSQL with `cursor=true`), and
//! the relay's pipeline over it: the cheapest way out. The relay takes the source's cursor
//! (one relay at a time; another waits until it lets go, at once when it dies), reads each
//! batch past it without writing anything, and once the destination confirmed a batch moves
//! the cursor past it, which deletes its rows as one range. The stages overlap as for `get`:
//! while batch `k` is sent, the cursor moves past `k - 1` and `k + 1` is read. What is left of
//! a message's delay travels on as its [`DelayStamp`](courier_core::DelayStamp), for the
//! destination to serve.

use std::time::Duration;

use async_trait::async_trait;
use courier_core::relay::{Forward, RelayPoint, RelayStats};
use courier_core::{CancellationToken, Envelope, TransportError};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Pipe;

/// Where a cursor stands in its source: just after the last message read (or relayed), in the
/// source's own order. Opaque to the relay, which only hands positions back; the default
/// stands before every message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorPosition {
    /// The major part of the order (PostgreSQL: the id of the transaction that wrote the
    /// message).
    pub major: i64,
    /// The minor part (PostgreSQL: the row's id).
    pub minor: i64,
}

/// A queue read by a cursor rather than taken message by message: reading writes nothing, and
/// the messages a relay forwarded are removed in bulk when it moves the cursor past them. The
/// cheapest way out of an outbox: [`Drain`](super::Drain) locks and deletes each row (two
/// writes of every row), [`get`](courier_core::Transport::get) then `ack_batch` claims and deletes
/// (two writes and two statements); a cursor reads each row once and deletes a range.
///
/// One reader at a time: the cursor is held under a [`CursorLease`]. A second relay waits
/// until the first lets go of it: at once when the first dies (PostgreSQL: the lease is a lock
/// of the holder's session, which ends with its process), within the lease when the first is
/// cut off from the source. It then goes on from where the cursor stands: whatever the first
/// had sent past it is sent again (at least once).
///
/// The order is the source's own and the same for every reader (PostgreSQL: the order of the
/// writing transactions' ids, then of the rows within one); a message is read only once no
/// message can appear before it any more (PostgreSQL: once every transaction that began
/// before it ended), so a reader never skips one that commits late.
#[async_trait]
pub trait CursorSource: Send + Sync {
    /// Takes the cursor for `owner` (a name for operators), to be held while the holder
    /// answers within `lease`; `None` while another holds it.
    async fn acquire(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Box<dyn CursorLease>>, TransportError>;

    /// Up to `max` messages after `after`, in the source's order, waiting up to the
    /// transport's poll window for the first; with the position just after the last (`after`
    /// itself when there are none). Reading moves nothing: read again from the same position,
    /// the same messages come back. A message stored with a delay still to run comes with a
    /// [`DelayStamp`](courier_core::DelayStamp) of what is left of it (its destination serves it); one
    /// whose delay ran out comes without one.
    async fn read(
        &self,
        after: CursorPosition,
        max: usize,
    ) -> Result<(Vec<Envelope>, CursorPosition), TransportError>;
}

/// A held cursor (see [`CursorSource::acquire`]). Dropping it lets the cursor go.
#[async_trait]
pub trait CursorLease: Send {
    /// Where the cursor stood when it was taken.
    fn position(&self) -> CursorPosition;

    /// Moves the cursor to `to` and removes every message up to it for good. An error may mean
    /// the lease is gone (its session ended): drop this lease and take the cursor again, from
    /// where it stands.
    async fn advance(&mut self, to: CursorPosition) -> Result<(), TransportError>;

    /// Tells the source the holder is alive, so that the lease does not run out while it has
    /// nothing to move (call it well within the lease). An error: as for
    /// [`advance`](Self::advance).
    async fn renew(&mut self) -> Result<(), TransportError>;
}

/// How often a relay waiting for a cursor another holds tries to take it.
const CURSOR_RETAKE: Duration = Duration::from_secs(2);

impl Pipe<'_> {
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
        let owner = courier_core::worker::default_worker_id();
        let mut stats = RelayStats::default();
        let mut left = self.settings().limit.unwrap_or(u64::MAX);
        let mut waits = self.settings().backoff.attempts();
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
                        tracing::info!(from = %self.source_name(), to = %self.destination_name(), "relay: took the outbox's cursor");
                    }
                    return Ok(Some(held));
                }
                Ok(None) => {}
                Err(e) if e.is_transient() && shutdown.is_cancelled() => return Ok(None),
                Err(e) => return Err(e),
            }
            if !told {
                told = true;
                tracing::info!(from = %self.source_name(), to = %self.destination_name(),
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
                next_lag = Instant::now() + self.settings().lag_every;
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
                    let done = tokio::join!(self.send(&sending, Forward::Read, shutdown), async {
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
                tracing::warn!(from = %self.source_name(), to = %self.destination_name(), error = %courier_core::error_chain(&e),
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
