//! The relay: forwards messages from one transport (an outbox queue) to another, unchanged.
//!
//! The transactional outbox: a service writes its messages into a SQL queue of its own database
//! inside its business transaction (`courier_sql::dispatch_in`), so they exist exactly when the
//! transaction commits; a [`Relay`] then moves them to the transport consumers read (RabbitMQ,
//! Redis, another database). Each batch goes through three steps:
//!
//! 1. `get(batch_size)` on the source (a SQL claim: the rows stay, claimed);
//! 2. `send_batch` to the destination, which returns once the destination confirmed every
//!    message (publisher confirms, the `XADD` replies, the `INSERT`);
//! 3. `ack_batch` on the source: the rows are deleted only now.
//!
//! [`Relay::run`] pipelines them: while batch `k` is sent, batch `k - 1` (confirmed) is acked
//! and batch `k + 1` fetched, and the next step starts once all three are done. So at most
//! one batch is fetched ahead and one ack is in flight, the sends stay sequential in fetch
//! order, and a batch is acked only after its confirmation. Where the source acks and claims
//! in one round trip ([`Capabilities::ack_with_get`](crate::Capabilities::ack_with_get): SQL
//! on PostgreSQL), the ack of `k - 1` rides on the fetch of `k + 1`
//! ([`Transport::ack_and_get`]); elsewhere the two run side by side.
//! The send runs on a task of its own, so on a multi-threaded runtime encoding for the
//! destination and decoding the next batch use two cores.
//!
//! A source that drains ([`Transport::as_drain`]: SQL on PostgreSQL) is read another way:
//! each batch is deleted with `DELETE ... RETURNING` in a transaction held open while it is
//! sent, and committed once the destination confirmed it. One write per row instead of two
//! (the claim's update, then the delete); a relay that dies leaves its transactions to roll
//! back, so its batches come back at once. The pipeline is the same: batch `k - 1` commits
//! and `k + 1` is drained while `k` is sent. A destination that keeps refusing a batch past
//! [`RelayOptions::hold_limit`] (30 s) does not keep its transaction open through the outage:
//! the relay rolls back both held batches (their rows back in the outbox, locked by nobody,
//! vacuum free to run), resends the refused batch from memory until the destination takes it,
//! deletes its rows by id, and drains on from there, in order.
//!
//! A crash after a confirmation and before the ack sends the batch again once the source's
//! redelivery window passes, or at once from a draining source (at least once; an inbox on the
//! consumer side makes it exactly once). Envelopes travel with
//! every stamp they were written with (the same [`MessageIdStamp`](crate::MessageIdStamp), bus
//! name, trace context...); only what describes the source delivery is dropped
//! ([`ReceivedStamp`], [`TransportMessageIdStamp`], [`DeliveryTagStamp`], [`SentStamp`]), and
//! the [`DelayStamp`], whose delay the source served already. A message whose type the relay
//! does not know travels as it was stored (an undecodable envelope keeps its wire form).
//!
//! Order: one send is in flight at a time, so the destination receives a queue's messages in
//! the order the source hands them out (SQL: priority, then time, then id), where the
//! destination keeps order. Several relays on one source share its rows but not that order.
//!
//! ```
//! use courier_core::relay::{Relay, RelayOptions};
//! use courier_core::{Envelope, InMemoryTransport, Message, MessageIdStamp, Transport};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Placed { order: u32 }
//! impl Message for Placed { const NAME: &'static str = "orders.placed"; }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let outbox = InMemoryTransport::new();
//! let broker = InMemoryTransport::new();
//! let id = MessageIdStamp::new();
//! outbox.send(Envelope::new(Placed { order: 1 }).with(id.clone())).await?;
//!
//! let relay = Relay::new("outbox", Arc::new(outbox.clone()), "broker", Arc::new(broker.clone()))
//!     .options(RelayOptions::default().batch_size(50));
//! assert_eq!(relay.relay_batch().await?, 1);
//! assert_eq!(broker.sent()[0].last::<MessageIdStamp>(), Some(&id));    // the same id
//! assert_eq!(outbox.acked().len(), 1);                                // acked at the source
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    Backoff, DelayStamp, DeliveryTagStamp, Drain, Drained, Envelope, ReceivedStamp, SentStamp,
    Transport, TransportError, TransportMessageIdStamp,
};

/// How a [`Relay`] works.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayOptions {
    /// Messages fetched, sent and acked per batch (default 100).
    pub batch_size: usize,
    /// How often the relay samples its source's lag into
    /// [`RELAY_LAG`](crate::metrics::RELAY_LAG) (default 5 s).
    pub lag_every: Duration,
    /// The waits between attempts after a transient failure (default 100 ms doubling to 10 s).
    pub backoff: Backoff,
    /// [`Relay::run`] returns once it forwarded this many messages (it fetches no more);
    /// `None` (the default): it runs until shut down.
    pub limit: Option<u64>,
    /// From a draining source: the longest a batch stays held (its PostgreSQL transaction
    /// open, holding back vacuum) while the destination refuses it (default 30 s). Past it the
    /// relay lets the batch go back to the source (and the one drained ahead), waits the outage
    /// out by resending the batch from memory, holding nothing, then deletes its rows by id.
    pub hold_limit: Duration,
    pause: Option<(RelayPoint, PathBuf)>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            batch_size: 100,
            lag_every: Duration::from_secs(5),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            limit: None,
            hold_limit: Duration::from_secs(30),
            pause: None,
        }
    }
}

impl RelayOptions {
    /// Sets [`RelayOptions::batch_size`] (at least 1).
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// Sets [`RelayOptions::lag_every`].
    #[must_use]
    pub fn lag_every(mut self, every: Duration) -> Self {
        self.lag_every = every;
        self
    }

    /// Sets [`RelayOptions::backoff`].
    #[must_use]
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets [`RelayOptions::limit`].
    #[must_use]
    pub fn limit(mut self, limit: Option<u64>) -> Self {
        self.limit = limit;
        self
    }

    /// Sets [`RelayOptions::hold_limit`].
    #[must_use]
    pub fn hold_limit(mut self, limit: Duration) -> Self {
        self.hold_limit = limit;
        self
    }

    /// Testing hook, not a stable API: at `point` of the first batch, create `file` and stop
    /// forever, so that a crash test can kill the process exactly there.
    #[doc(hidden)]
    #[must_use]
    pub fn pause_at(mut self, point: RelayPoint, file: impl Into<PathBuf>) -> Self {
        self.pause = Some((point, file.into()));
        self
    }
}

/// Testing hook, not a stable API: where [`RelayOptions::pause_at`] stops a relay.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayPoint {
    /// The destination confirmed the batch; its source rows are not deleted yet (the next
    /// batch is fetched, not sent).
    AfterConfirm,
    /// The batch's source rows are deleted; the batch after it is confirmed (it was sent
    /// meanwhile), not deleted, and no later batch is sent yet.
    AfterDelete,
}

impl std::str::FromStr for RelayPoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "after_confirm" => Ok(Self::AfterConfirm),
            "after_delete" => Ok(Self::AfterDelete),
            other => Err(format!(
                "unknown relay point `{other}` (expected after_confirm or after_delete)"
            )),
        }
    }
}

/// What a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Messages forwarded (confirmed by the destination, acked at the source).
    pub relayed: u64,
    /// Batches forwarded.
    pub batches: u64,
}

/// Forwards messages from a source transport to a destination: see the [module docs](self).
#[derive(Debug)]
pub struct Relay {
    from_name: String,
    from: Arc<dyn Transport>,
    to_name: String,
    to: Arc<dyn Transport>,
    options: RelayOptions,
    relayed: metrics::Counter,
    batches: metrics::Counter,
    lag: metrics::Gauge,
}

impl Relay {
    /// A relay from `from` to `to` (the names label its logs and metrics).
    #[must_use]
    pub fn new(
        from_name: impl Into<String>,
        from: Arc<dyn Transport>,
        to_name: impl Into<String>,
        to: Arc<dyn Transport>,
    ) -> Self {
        let (from_name, to_name) = (from_name.into(), to_name.into());
        let labels = [("from", from_name.clone()), ("to", to_name.clone())];
        Self {
            relayed: metrics::counter!(crate::metrics::RELAYED, &labels),
            batches: metrics::counter!(crate::metrics::RELAY_BATCHES, &labels),
            lag: metrics::gauge!(crate::metrics::RELAY_LAG, "from" => from_name.clone()),
            from_name,
            from,
            to_name,
            to,
            options: RelayOptions::default(),
        }
    }

    /// Replaces the options.
    #[must_use]
    pub fn options(mut self, options: RelayOptions) -> Self {
        self.options = options;
        self
    }

    /// Forwards one batch: fetches up to `batch_size` messages (waiting up to the source's poll
    /// window), sends them to the destination, then acks them at the source. Returns how many
    /// it forwarded (0: the source had none).
    ///
    /// # Errors
    /// The first failure, untried again: a failed send leaves the batch claimed at the source,
    /// to be fetched again after its redelivery window. [`run`](Self::run) retries instead.
    pub async fn relay_batch(&self) -> Result<usize, TransportError> {
        let batch = self.from.get(self.options.batch_size).await?;
        if batch.is_empty() {
            return Ok(0);
        }
        self.to.send_batch(outgoing(&batch)).await?;
        self.pause(RelayPoint::AfterConfirm).await;
        self.from.ack_batch(&batch).await?;
        self.done(batch.len());
        self.pause(RelayPoint::AfterDelete).await;
        Ok(batch.len())
    }

    /// Forwards batches, pipelined (see the [module docs](self)), until `shutdown` is
    /// cancelled or [`RelayOptions::limit`] messages are forwarded. On shutdown the step in
    /// flight finishes, then the batch fetched ahead is sent and acked too, rather than put
    /// back (putting it back would move it behind the rows not fetched yet): the stop takes at
    /// most the source's poll window plus two batches. Transient failures are retried with
    /// [`RelayOptions::backoff`], the batch being sent kept alive at the source meanwhile.
    ///
    /// # Errors
    /// A failure that is not transient (a message the destination refuses, a missing table),
    /// or a transient one once `shutdown` is cancelled: the unacked batches stay at the source
    /// (delivered again after its redelivery window), so the relay stops there rather than
    /// skip them.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<RelayStats, TransportError> {
        if let Some(drain) = self.from.as_drain() {
            return self.run_drained(drain, &shutdown).await;
        }
        let mut stats = RelayStats::default();
        let mut next_lag = Instant::now();
        let mut left = self.options.limit.unwrap_or(u64::MAX);
        // Batch k (fetched, sent this step) and batch k - 1 (confirmed, acked this step).
        let (mut sending, mut acking) = (Vec::new(), Vec::new());
        loop {
            let want = self.wanted(left, &shutdown);
            if want == 0 && sending.is_empty() && acking.is_empty() {
                return Ok(stats);
            }
            if Instant::now() >= next_lag {
                self.sample_lag().await;
                next_lag = Instant::now() + self.options.lag_every;
            }
            let (sent, next) = tokio::join!(
                self.send(&sending, true, &shutdown),
                self.ack_and_fetch(&acking, want, &shutdown),
            );
            let next = next?;
            if !acking.is_empty() {
                self.done(acking.len());
                stats.relayed += acking.len() as u64;
                stats.batches += 1;
                self.pause(RelayPoint::AfterDelete).await;
            }
            let retried = sent?;
            if !sending.is_empty() {
                self.pause(RelayPoint::AfterConfirm).await;
            }
            if retried && !next.is_empty() {
                // The send took retries: refresh the batch fetched meanwhile before its turn.
                if let Err(e) = self.from.keepalive_batch(&next).await {
                    tracing::debug!(error = %e, "relay: keepalive of a batch failed");
                }
            }
            left = left.saturating_sub(next.len() as u64);
            acking = std::mem::replace(&mut sending, next);
        }
    }

    /// [`run`](Self::run) on a source that drains ([`Drain`]: SQL on PostgreSQL): the same
    /// pipeline, with each batch held in a source transaction instead of claimed. While batch
    /// `k` is sent, the transaction of `k - 1` (confirmed) commits, deleting its rows, and
    /// batch `k + 1` is drained. A commit that fails rolled its transaction back: those
    /// messages are relayed again (at least once), as are the held batches of a relay that
    /// dies, at once rather than after a redelivery window.
    async fn run_drained(
        &self,
        drain: &dyn Drain,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        let mut stats = RelayStats::default();
        let mut next_lag = Instant::now();
        let mut left = self.options.limit.unwrap_or(u64::MAX);
        let (mut sending, mut committing) = (Drained::empty(), Drained::empty());
        loop {
            let want = self.wanted(left, shutdown);
            if want == 0 && sending.is_empty() && committing.is_empty() {
                return Ok(stats);
            }
            if Instant::now() >= next_lag {
                self.sample_lag().await;
                next_lag = Instant::now() + self.options.lag_every;
            }
            let confirmed = std::mem::replace(&mut committing, Drained::empty());
            // The envelopes only: a `&Drained` held across an await would need a `Sync` hold.
            let outgoing = &sending.envelopes;
            let (sent, committed, next) = tokio::join!(
                async {
                    if outgoing.is_empty() {
                        return Ok(true);
                    }
                    // A send still refused at the hold limit gives the held batch up.
                    tokio::time::timeout(
                        self.options.hold_limit,
                        self.send(outgoing, false, shutdown),
                    )
                    .await
                    .map_or(Ok(false), |sent| sent.map(|_| true))
                },
                self.commit(confirmed),
                async {
                    if want == 0 {
                        return Ok(Drained::empty());
                    }
                    self.retrying("draining", shutdown, |_| drain.drain(want))
                        .await
                        .or_else(|e| {
                            if e.is_transient() && shutdown.is_cancelled() {
                                Ok(Drained::empty())
                            } else {
                                Err(e)
                            }
                        })
                },
            );
            if let Some(n) = committed {
                self.done(n);
                stats.relayed += n as u64;
                stats.batches += 1;
                self.pause(RelayPoint::AfterDelete).await;
            }
            let next = next?;
            if !sent? {
                // Both batches go back to the source: the one drained ahead must follow (it
                // was not counted against the limit yet).
                drop(next);
                let released = std::mem::replace(&mut sending, Drained::empty());
                let n = self.resend_released(released, shutdown).await?;
                self.done(n);
                stats.relayed += n as u64;
                stats.batches += 1;
                continue;
            }
            if !sending.is_empty() {
                self.pause(RelayPoint::AfterConfirm).await;
            }
            left = left.saturating_sub(next.envelopes.len() as u64);
            committing = std::mem::replace(&mut sending, next);
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
        tracing::warn!(from = %self.from_name, to = %self.to_name, messages = envelopes.len(),
            hold_limit_ms = u64::try_from(self.options.hold_limit.as_millis()).unwrap_or(u64::MAX),
            "relay: the destination is still refusing; the held batch went back to the source, and is resent from memory until the destination takes it");
        self.send(&envelopes, false, shutdown).await?;
        self.retrying("deleting a resent batch", shutdown, |_| {
            self.from.ack_batch(&envelopes)
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
        match batch.commit().await {
            Ok(()) => Some(n),
            Err(e) => {
                tracing::warn!(from = %self.from_name, to = %self.to_name, error = %crate::error_chain(&e), messages = n,
                    "relay: committing a confirmed batch failed; its messages are back at the source and will be relayed again");
                None
            }
        }
    }

    /// How many messages to fetch next: none once shut down or at the limit.
    fn wanted(&self, left: u64, shutdown: &CancellationToken) -> usize {
        if shutdown.is_cancelled() {
            return 0;
        }
        usize::try_from(left).map_or(self.options.batch_size, |left| {
            left.min(self.options.batch_size)
        })
    }

    /// Sends a fetched batch to the destination, retrying transient failures (with the batch
    /// kept alive at the source when `keepalive`: a claimed batch; a drained one is held by
    /// its transaction); returns whether it took a retry.
    async fn send(
        &self,
        batch: &[Envelope],
        keepalive: bool,
        shutdown: &CancellationToken,
    ) -> Result<bool, TransportError> {
        if batch.is_empty() {
            return Ok(false);
        }
        let sending = outgoing(batch);
        let mut retried = false;
        self.retrying("sending", shutdown, |again| {
            retried |= again;
            let sending = sending.clone();
            async move {
                if again
                    && keepalive
                    && let Err(e) = self.from.keepalive_batch(batch).await
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
                match (&mut task.0).await {
                    Ok(sent) => sent,
                    Err(e) => Err(TransportError::new(
                        crate::TransportErrorKind::Protocol,
                        self.to_name.clone(),
                    )
                    .with_context(format!("the send task failed: {e}"))),
                }
            }
        })
        .await?;
        Ok(retried)
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
                .retrying("fetching", shutdown, |_| self.from.get(want))
                .await
                .or_else(stopped);
        }
        if self.from.capabilities().ack_with_get {
            // Acking twice is not an error: a failed attempt is retried with the same acks.
            return self
                .retrying("acking and fetching", shutdown, |_| {
                    self.from.ack_and_get(acks, want)
                })
                .await;
        }
        let (acked, next) = tokio::join!(
            self.retrying("acking", shutdown, |_| self.from.ack_batch(acks)),
            async {
                if want == 0 {
                    return Ok(Vec::new());
                }
                self.retrying("fetching", shutdown, |_| self.from.get(want))
                    .await
                    .or_else(stopped)
            },
        );
        acked?;
        next
    }

    /// Runs `attempt` (told whether it is a retry) until it succeeds, waiting with
    /// [`RelayOptions::backoff`] after each transient failure; returns a failure that is not
    /// transient, or any once `shutdown` is cancelled.
    async fn retrying<T, F>(
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

    fn done(&self, n: usize) {
        self.relayed.increment(n as u64);
        self.batches.increment(1);
        tracing::debug!(from = %self.from_name, to = %self.to_name, messages = n, "relayed a batch");
    }

    async fn sample_lag(&self) {
        let Some(counter) = self.from.as_message_count() else {
            return;
        };
        match counter.oldest_age().await {
            Ok(age) => self.lag.set(age.unwrap_or_default().as_secs_f64()),
            Err(e) => tracing::debug!(from = %self.from_name, error = %e, "relay lag not sampled"),
        }
    }

    async fn wait(
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

    async fn pause(&self, at: RelayPoint) {
        let Some((point, file)) = &self.options.pause else {
            return;
        };
        if *point != at {
            return;
        }
        if let Err(e) = std::fs::write(file, std::process::id().to_string()) {
            tracing::warn!(error = %e, "relay: cannot write the pause file");
        }
        std::future::pending::<()>().await;
    }
}

/// The envelopes to send for a fetched batch: every stamp but those of the source delivery and
/// the served delay.
fn outgoing(batch: &[Envelope]) -> Vec<Envelope> {
    batch
        .iter()
        .map(|e| {
            e.clone()
                .without_all::<ReceivedStamp>()
                .without_all::<TransportMessageIdStamp>()
                .without_all::<DeliveryTagStamp>()
                .without_all::<SentStamp>()
                .without_all::<DelayStamp>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InMemoryTransport, Message, PriorityStamp};
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Item {
        n: u32,
    }
    impl Message for Item {
        const NAME: &'static str = "test.item";
    }

    #[tokio::test]
    async fn a_relay_forwards_in_order_with_the_same_stamps_and_acks_the_source() {
        let from = InMemoryTransport::new();
        let to = InMemoryTransport::new();
        for n in 0..5 {
            from.send(Envelope::new(Item { n }).with(PriorityStamp(0)))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let relay = Relay::new("outbox", Arc::new(from.clone()), "to", Arc::new(to.clone()))
            .options(RelayOptions::default().batch_size(2));
        let mut total = 0;
        while total < 5 {
            total += relay.relay_batch().await.unwrap_or_else(|e| panic!("{e}"));
        }
        let sent = to.sent();
        let order: Vec<u32> = sent
            .iter()
            .filter_map(|e| e.message::<Item>().map(|m| m.n))
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 4]);
        assert!(sent.iter().all(|e| e.has::<PriorityStamp>()));
        assert_eq!(from.acked().len(), 5);
    }
}
