//! The steps every pipeline of a relay is made of, its own and those of a
//! [`RelaySource`](super::RelaySource):
//! sending a batch to the destination, retrying, bounding a call to the source, counting and
//! probing.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{BATCHES_AHEAD, MIN_HOLD_BOUND, Probe, Relay, RelayPoint, RelayStats};
use crate::{
    DelayStamp, DeliveryTagStamp, Envelope, ReceivedStamp, SentStamp, Transport, TransportError,
    TransportMessageIdStamp,
};

/// How a batch being sent is held at its source, which decides what [`Relay::send`] does
/// while the destination refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forward {
    /// Claimed by `get`: kept alive at the source between attempts, each attempt given up at
    /// the hold limit; the source served the delays.
    Claimed,
    /// Held by the source (a transaction): nothing to keep alive; the source served the
    /// delays.
    Held,
    /// Read past a cursor: nothing to keep alive; each envelope's [`DelayStamp`] is what is
    /// left of its delay, for the destination to serve.
    Read,
}

impl Relay {
    /// The source's name (its logs and metrics label).
    #[must_use]
    pub fn source_name(&self) -> &str {
        &self.from_name
    }

    /// The destination's name.
    #[must_use]
    pub fn destination_name(&self) -> &str {
        &self.to_name
    }

    /// The source transport.
    #[must_use]
    pub fn source(&self) -> &Arc<dyn Transport> {
        &self.from
    }

    /// The relay's options.
    #[must_use]
    pub fn settings(&self) -> &super::RelayOptions {
        &self.options
    }

    /// Counts a forwarded batch of `n` messages (`None`: nothing was forwarded).
    pub fn count(&self, n: Option<usize>, stats: &mut RelayStats) {
        if let Some(n) = n {
            self.done(n);
            stats.relayed += n as u64;
            stats.batches += 1;
        }
    }

    /// The longest a drained batch may stay held, and a call to the source go unanswered (see
    /// [`RelayOptions::hold_limit`](super::RelayOptions::hold_limit)): behind the sends of the batches drained before it and its
    /// own, each bounded by the hold limit, and once more as slack; a minute at
    /// least.
    pub fn hold_bound(&self) -> Duration {
        self.options
            .hold_limit
            .saturating_mul(
                u32::try_from(BATCHES_AHEAD)
                    .unwrap_or(u32::MAX)
                    .saturating_add(2),
            )
            .max(MIN_HOLD_BOUND)
    }

    /// Runs a call to the source (a drain, a commit, a fetch, an ack), giving up after
    /// [`hold_bound`](Self::hold_bound): a connection that answers nothing (a network partition, a connection black-holed by a
    /// failover) would otherwise keep the relay waiting until TCP gives up (many minutes); a
    /// drained batch's hold ends on the source's side by then anyway. The timeout is
    /// transient: the call is tried again (acking twice is harmless), a commit's batch comes
    /// back.
    ///
    /// # Errors
    /// The call's, or a transient [`TransportErrorKind::Timeout`](crate::TransportErrorKind)
    /// when it went unanswered.
    pub async fn bounded<T>(
        &self,
        doing: &'static str,
        call: impl std::future::Future<Output = Result<T, TransportError>>,
    ) -> Result<T, TransportError> {
        crate::transport::answered_within(Some(self.hold_bound()), &self.from_name, doing, call)
            .await
    }

    /// How many messages to fetch next: none once shut down or at the limit.
    pub fn wanted(&self, left: u64, shutdown: &CancellationToken) -> usize {
        if shutdown.is_cancelled() {
            return 0;
        }
        usize::try_from(left).map_or(self.options.batch_size, |left| {
            left.min(self.options.batch_size)
        })
    }

    /// Sends a batch taken from the source to the destination, once the destination confirmed
    /// every message, retrying transient failures with [`RelayOptions::backoff`](super::RelayOptions::backoff) (a claimed
    /// batch kept alive at the source between attempts, see [`Forward`]); returns whether it
    /// took a retry. Every stamp of the source delivery is dropped first (see the
    /// [module docs](super)).
    ///
    /// # Errors
    /// A failure that is not transient, or any once `shutdown` is cancelled.
    pub async fn send(
        &self,
        batch: &[Envelope],
        how: Forward,
        shutdown: &CancellationToken,
    ) -> Result<bool, TransportError> {
        let keepalive = how == Forward::Claimed;
        let keep_delay = how == Forward::Read;
        if batch.is_empty() {
            return Ok(false);
        }
        let mut retried = false;
        self.retrying("sending", shutdown, |again| {
            retried |= again;
            // Copied for each attempt (the destination takes its batch by value).
            let sending = outgoing(batch, keep_delay);
            async move {
                if again
                    && keepalive
                    && let Err(e) = self
                        .bounded("keeping a batch alive", self.from.keepalive_batch(batch))
                        .await
                {
                    tracing::debug!(error = %e, "relay: keepalive of a batch failed");
                }
                // On a task of its own: encoding for the destination runs beside the decoding
                // of the next batch (on another worker thread of a multi-threaded runtime).
                // Aborted if this attempt is dropped (the hold limit, a relay stopped from
                // outside): no send outlives its attempt to race the next one.
                let to = Arc::clone(&self.to);
                let mut task = crate::worker::AbortOnDrop(tokio::spawn(async move {
                    to.send_batch(sending).await.map(drop)
                }));
                let joined = async {
                    match (&mut task.0).await {
                        Ok(sent) => sent,
                        Err(e) => Err(TransportError::new(
                            crate::TransportErrorKind::Protocol,
                            self.to_name.clone(),
                        )
                        .with_context(format!("the send task failed: {e}"))),
                    }
                };
                // A claimed batch's attempt that the destination leaves unanswered (a
                // connection black-holed by a failover) is given up at the hold limit and
                // tried again, the batch kept alive first; a drained batch's whole send is
                // bounded by the hold limit already.
                let limit = keepalive.then_some(self.options.hold_limit);
                crate::transport::answered_within(limit, &self.to_name, "sending", joined).await
            }
        })
        .await?;
        Ok(retried)
    }

    /// Runs `attempt` (told whether it is a retry) until it succeeds, waiting with
    /// [`RelayOptions::backoff`](super::RelayOptions::backoff) after each transient failure; returns a failure that is not
    /// transient, or any once `shutdown` is cancelled.
    ///
    /// # Errors
    /// The last failure, as said.
    pub async fn retrying<T, F>(
        &self,
        doing: &str,
        shutdown: &CancellationToken,
        mut attempt: impl FnMut(bool) -> F,
    ) -> Result<T, TransportError>
    where
        F: std::future::Future<Output = Result<T, TransportError>>,
    {
        let mut waits = self.options.backoff.attempts();
        let mut again = false;
        loop {
            match attempt(again).await {
                Ok(done) => return Ok(done),
                Err(e) if e.is_transient() && !shutdown.is_cancelled() => {
                    self.wait(doing, &e, &mut waits, shutdown).await;
                    again = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) fn done(&self, n: usize) {
        self.relayed.increment(n as u64);
        self.batches.increment(1);
        tracing::debug!(from = %self.from_name, to = %self.to_name, messages = n, "relayed a batch");
    }

    /// Samples the source's lag (the age of its oldest message, where it can tell) into
    /// [`RELAY_LAG`](crate::metrics::RELAY_LAG).
    pub async fn sample_lag(&self) {
        let Some(counter) = self.from.as_message_count() else {
            return;
        };
        match counter.oldest_age().await {
            Ok(age) => self.lag.set(age.unwrap_or_default().as_secs_f64()),
            Err(e) => tracing::debug!(from = %self.from_name, error = %e, "relay lag not sampled"),
        }
    }

    /// Logs that `doing` failed with `error`, then waits the next of `waits` (or until
    /// `shutdown`).
    pub async fn wait(
        &self,
        doing: &str,
        error: &TransportError,
        waits: &mut crate::Attempts,
        shutdown: &CancellationToken,
    ) {
        let wait = waits.failed();
        tracing::warn!(from = %self.from_name, to = %self.to_name, error = %crate::error_chain(error),
            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "relay: {doing} failed, retrying");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => {}
        }
    }

    /// Calls the [`RelayOptions::on_point`](super::RelayOptions::on_point) probe, if any, at `point` and waits for it.
    pub async fn probe(&self, point: RelayPoint) {
        if let Some(Probe(probe)) = &self.options.probe {
            probe(point).await;
        }
    }
}

/// The envelopes to send for a fetched batch: every stamp but those of the source delivery and
/// the served delay (`keep_delay`: the delay left, from a cursor source, is kept).
pub(super) fn outgoing(batch: &[Envelope], keep_delay: bool) -> Vec<Envelope> {
    batch
        .iter()
        .map(|e| {
            let e = e
                .clone()
                .without_all::<ReceivedStamp>()
                .without_all::<TransportMessageIdStamp>()
                .without_all::<DeliveryTagStamp>()
                .without_all::<SentStamp>();
            if keep_delay {
                e
            } else {
                e.without_all::<DelayStamp>()
            }
        })
        .collect()
}
