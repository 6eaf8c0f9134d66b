//! Draining an outbox: taking messages out under a transaction held until committed
//! ([`Drain`]: SQL on PostgreSQL), and the relay's pipeline over it.
//!
//! Each batch is locked and deleted (`DELETE ... RETURNING`) in a transaction held open while
//! it is sent, and committed once the destination confirmed it. One write per row instead of
//! two (the claim's update, then the delete); a relay that dies leaves its transactions to
//! roll back, so its batches come back at once. Its stages overlap further: up to two batches
//! are drained ahead, the next drain starting as soon as the one before holds its rows (it
//! then takes the rows behind them, so the order holds), while the server still deletes and
//! returns them; batch `k - 1` commits while `k` is sent, and `k + 1` is sent only once
//! `k - 1` committed. A destination that keeps refusing a batch past
//! [`RelayOptions::hold_limit`](courier_core::relay::RelayOptions::hold_limit) (30 s) does not
//! keep a transaction open through the outage: the relay rolls back every batch it holds
//! (their rows back in the outbox, locked by nobody, vacuum free to run), resends the refused
//! batch from memory until the destination takes it, deletes its rows by id, and drains on
//! from there, in order.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use courier_core::relay::{BATCHES_AHEAD, Forward, RelayPoint, RelayStats};
use courier_core::{CancellationToken, Envelope, TransportError};
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, OptionFuture};
use futures_util::stream::FuturesOrdered;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Pipe;

/// Takes messages out of a queue for good in one step, held back until committed: a
/// PostgreSQL `DELETE ... RETURNING` of rows locked `FOR UPDATE SKIP LOCKED`, in a transaction
/// left open until [`Drained::commit`]. Other consumers skip the held rows; dropping the batch
/// (or the process dying) rolls the transaction back and puts every row back where it was.
///
/// Beside `get` then `ack_batch`, this writes each row once (a delete) instead of twice (the
/// claim's update, then the delete), and a crashed holder's rows come back at once rather than
/// after the redelivery window. The price: a batch held for long keeps its transaction open,
/// which on PostgreSQL holds back vacuum. The relay holds one at most
/// [`RelayOptions::hold_limit`](courier_core::relay::RelayOptions::hold_limit) while its destination
/// refuses it, then drops the hold; a server that ends the transaction only makes its messages
/// come back to be relayed again.
///
/// A holder cut off from the store (a network partition, a host that froze) cannot roll back,
/// and the store may not notice for hours (PostgreSQL waits for TCP keepalives, two hours by
/// default): each drain says how long its batch may stay held (`hold_for`), and the store ends
/// the hold on its own side past it (PostgreSQL: `idle_in_transaction_session_timeout` on the
/// drain's transaction), so the messages come back to another relay within that bound.
///
/// Drains may overlap without giving up the queue's order: each tells `held` as soon as its
/// rows are locked, before it reads them back, and a drain started after that skips them and
/// takes the messages behind them. A relay starts its next drain at that signal, so the
/// slower half of one drain (the delete, reading the rows back, decoding them) runs beside the
/// next.
#[async_trait]
pub trait Drain: Send + Sync {
    /// Takes up to `max` messages in the order `get` hands them out, waiting up to the
    /// transport's poll window for the first; an empty batch when none came. Calls
    /// `held.notify_one()` once the batch's messages are locked, before they are read back (a
    /// drain started after that takes the messages behind them); never for an empty batch,
    /// whose drain may still be waiting for the first message: start the next one when it
    /// returns. The batch stays held at most `hold_for` while its holder is silent: past it
    /// the store may end the hold (the messages come back and a later commit fails).
    async fn drain(
        &self,
        max: usize,
        hold_for: Duration,
        held: &Notify,
    ) -> Result<Drained, TransportError>;
}

/// What holds a drained batch back: committing removes its messages for good.
#[async_trait]
pub trait DrainHold: Send {
    /// Removes the held messages for good (commits the transaction).
    async fn commit(self: Box<Self>) -> Result<(), TransportError>;
}

/// A batch taken by [`Drain::drain`]: its messages, and the hold on them.
pub struct Drained {
    /// The messages, in queue order.
    pub envelopes: Vec<Envelope>,
    hold: Option<Box<dyn DrainHold>>,
}

impl Drained {
    /// A batch whose messages stay held by `hold` until [`commit`](Self::commit).
    #[must_use]
    pub fn new(envelopes: Vec<Envelope>, hold: Box<dyn DrainHold>) -> Self {
        Self {
            envelopes,
            hold: Some(hold),
        }
    }

    /// An empty batch, holding nothing.
    #[must_use]
    pub fn empty() -> Self {
        Self {
            envelopes: Vec::new(),
            hold: None,
        }
    }

    /// Whether the batch has no messages.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// Removes the batch's messages for good. On an error the hold is gone too (a broken
    /// connection rolled the transaction back): the messages are back in the queue.
    ///
    /// # Errors
    /// The store's, when the commit failed.
    pub async fn commit(mut self) -> Result<(), TransportError> {
        match self.hold.take() {
            Some(hold) => hold.commit().await,
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Drained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drained")
            .field("envelopes", &self.envelopes.len())
            .field("held", &self.hold.is_some())
            .finish()
    }
}

/// Resolves once `newest` holds its rows (never without one).
async fn held(newest: Option<&Notify>) {
    match newest {
        Some(notify) => notify.notified().await,
        None => std::future::pending().await,
    }
}

impl Pipe<'_> {
    /// [`run`](Self::run) on a source that drains ([`Drain`]: SQL on PostgreSQL): each batch
    /// is held in a source transaction instead of claimed. Three stages overlap: up to
    /// [`BATCHES_AHEAD`] batches are drained ahead, each drain started once the one before
    /// holds its rows (so they follow each other in the queue's order); one batch is sent;
    /// the batch confirmed before it commits, deleting its rows. A batch is sent only once the
    /// one two before it committed, so at most one confirmed batch awaits its commit. A commit
    /// that fails rolled its transaction back: those messages are relayed again (at least
    /// once), as are the held batches of a relay that dies, at once rather than after a
    /// redelivery window.
    pub(super) async fn run_drained(
        &self,
        drain: &dyn Drain,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        let mut stats = RelayStats::default();
        let mut left = self.settings().limit.unwrap_or(u64::MAX);
        while let Some(released) = self
            .drain_pipeline(drain, shutdown, &mut left, &mut stats)
            .await?
        {
            // Every other held batch went back to the source with it (not yet counted against
            // the limit: drained again in order once this one is through).
            let n = self.resend_released(released, shutdown).await?;
            self.count(Some(n), &mut stats);
        }
        Ok(stats)
    }

    /// The stages of [`run_drained`](Self::run_drained), until every message asked for is
    /// relayed (`None`) or the destination refused a batch past the hold limit: then every
    /// other held batch is rolled back, the commit in flight finished, and the refused batch
    /// returned for [`resend_released`](Self::resend_released).
    async fn drain_pipeline<'a>(
        &'a self,
        drain: &'a dyn Drain,
        shutdown: &'a CancellationToken,
        left: &mut u64,
        stats: &mut RelayStats,
    ) -> Result<Option<Drained>, TransportError> {
        let mut next_lag = Instant::now();
        // Drains under way, oldest first, with what each asked for (reserved against `left`).
        let mut draining: FuturesOrdered<BoxFuture<'a, (u64, Result<Drained, TransportError>)>> =
            FuturesOrdered::new();
        let mut asked = 0_u64;
        // The newest drain, until it holds its rows or ends: no other starts meanwhile.
        let mut newest: Option<Arc<Notify>> = None;
        let mut ready: VecDeque<Drained> = VecDeque::new();
        // The batch being sent: it comes back with whether the destination took it.
        let mut sending: Option<BoxFuture<'a, (Drained, Result<bool, TransportError>)>> = None;
        let mut confirmed: Option<Drained> = None;
        let mut committing: Option<BoxFuture<'a, Option<usize>>> = None;
        loop {
            if Instant::now() >= next_lag {
                self.sample_lag().await;
                next_lag = Instant::now() + self.settings().lag_every;
            }
            while newest.is_none() && draining.len() + ready.len() < BATCHES_AHEAD {
                let reserved = asked + ready.iter().map(|b| b.envelopes.len() as u64).sum::<u64>();
                let want = self.wanted(left.saturating_sub(reserved), shutdown);
                if want == 0 {
                    break;
                }
                let held = Arc::new(Notify::new());
                newest = Some(Arc::clone(&held));
                asked += want as u64;
                draining.push_back(Box::pin(async move {
                    let hold_for = self.hold_bound();
                    let drained = self
                        .retrying("draining", shutdown, |_| {
                            self.bounded("draining", drain.drain(want, hold_for, &held))
                        })
                        .await
                        .or_else(|e| {
                            if e.is_transient() && shutdown.is_cancelled() {
                                Ok(Drained::empty())
                            } else {
                                Err(e)
                            }
                        });
                    (want as u64, drained)
                }));
            }
            if sending.is_none()
                && confirmed.is_none()
                && let Some(batch) = ready.pop_front()
            {
                *left = left.saturating_sub(batch.envelopes.len() as u64);
                sending = Some(Box::pin(async move {
                    // The envelopes only: a `&Drained` held across an await would need a
                    // `Sync` hold. A send still refused at the hold limit gives the batch up.
                    let envelopes = &batch.envelopes;
                    let sent = tokio::time::timeout(
                        self.settings().hold_limit,
                        self.send(envelopes, Forward::Held, shutdown),
                    )
                    .await
                    .map_or(Ok(false), |sent| sent.map(|_| true));
                    if matches!(sent, Ok(true)) {
                        self.probe(RelayPoint::AfterConfirm).await;
                    }
                    (batch, sent)
                }));
            }
            if draining.is_empty()
                && ready.is_empty()
                && sending.is_none()
                && confirmed.is_none()
                && committing.is_none()
            {
                return Ok(None);
            }
            tokio::select! {
                Some((want, drained)) = draining.next(), if !draining.is_empty() => {
                    asked -= want;
                    if draining.is_empty() {
                        // It was the newest: whatever it holds, the next may start.
                        newest = None;
                    }
                    match drained {
                        Ok(batch) if !batch.is_empty() => ready.push_back(batch),
                        Ok(_) => {}
                        Err(e) => {
                            self.finish_commit(committing.take(), stats).await;
                            return Err(e);
                        }
                    }
                }
                () = held(newest.as_deref()), if newest.is_some() => newest = None,
                Some((batch, sent)) = OptionFuture::from(sending.as_mut()), if sending.is_some() => {
                    sending = None;
                    match sent {
                        Ok(true) if committing.is_none() => committing = Some(self.commit_then_probe(batch)),
                        Ok(true) => confirmed = Some(batch),
                        Ok(false) => {
                            // The batches drained ahead go back to the source, in order.
                            drop(draining);
                            drop(ready);
                            self.finish_commit(committing.take(), stats).await;
                            return Ok(Some(batch));
                        }
                        Err(e) => {
                            self.finish_commit(committing.take(), stats).await;
                            return Err(e);
                        }
                    }
                }
                Some(committed) = OptionFuture::from(committing.as_mut()), if committing.is_some() => {
                    committing = confirmed.take().map(|batch| self.commit_then_probe(batch));
                    self.count(committed, stats);
                }
            }
        }
    }

    /// Commits a confirmed drained batch (see [`commit`](Self::commit)), then calls the probe,
    /// if any, at [`RelayPoint::AfterDelete`].
    fn commit_then_probe(&self, batch: Drained) -> BoxFuture<'_, Option<usize>> {
        Box::pin(async move {
            let committed = self.commit(batch).await;
            if committed.is_some() {
                self.probe(RelayPoint::AfterDelete).await;
            }
            committed
        })
    }

    /// Waits for the commit under way, if any, and counts it: a relay that stops on an error
    /// does not throw away a batch the destination confirmed.
    async fn finish_commit(
        &self,
        committing: Option<BoxFuture<'_, Option<usize>>>,
        stats: &mut RelayStats,
    ) {
        if let Some(committing) = committing {
            self.count(committing.await, stats);
        }
    }

    /// A drained batch the destination kept refusing past [`RelayOptions::hold_limit`]: rolls
    /// its transaction back (the rows are back at the source, held by nobody), resends its
    /// envelopes from memory until the destination takes them (or shutdown), then deletes
    /// their rows by id. Returns how many it forwarded. A crash in between sends them again
    /// (at least once); so does another relay that drains them meanwhile.
    async fn resend_released(
        &self,
        mut released: Drained,
        shutdown: &CancellationToken,
    ) -> Result<usize, TransportError> {
        let envelopes = std::mem::take(&mut released.envelopes);
        // Rolled back now, not when this function returns.
        drop(released);
        tracing::warn!(from = %self.source_name(), to = %self.destination_name(), messages = envelopes.len(),
            hold_limit_ms = u64::try_from(self.settings().hold_limit.as_millis()).unwrap_or(u64::MAX),
            "relay: the destination is still refusing; the held batch went back to the source, and is resent from memory until the destination takes it");
        self.send(&envelopes, Forward::Held, shutdown).await?;
        self.retrying("deleting a resent batch", shutdown, |_| {
            self.source().ack_batch(&envelopes)
        })
        .await?;
        Ok(envelopes.len())
    }

    /// Commits a confirmed drained batch; how many messages it removed (`None`: nothing to
    /// commit, or the commit failed and the messages are back at the source).
    async fn commit(&self, batch: Drained) -> Option<usize> {
        if batch.is_empty() {
            return None;
        }
        let n = batch.envelopes.len();
        match self
            .bounded("committing a drained batch", batch.commit())
            .await
        {
            Ok(()) => Some(n),
            Err(e) => {
                tracing::warn!(from = %self.source_name(), to = %self.destination_name(), error = %courier_core::error_chain(&e), messages = n,
                    "relay: committing a confirmed batch failed; its messages are back at the source and will be relayed again");
                None
            }
        }
    }
}
