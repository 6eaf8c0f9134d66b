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
//! A source with a way of its own to be relayed offers a [`RelaySource`]
//! ([`Abilities::relay_source`](crate::Abilities::relay_source)): [`Relay::run`] hands it the relay, and it runs its own
//! pipeline with the relay's steps ([`Relay::send`], [`Relay::retrying`]...). SQL on PostgreSQL
//! offers two, in `courier-sql`: it drains each batch in a transaction held while the batch is
//! sent (one write per row, and a dead relay's batches come back at once), or reads past a
//! cursor and deletes what was relayed as one range.
//!
//! A crash after a confirmation and before the ack sends the batch again once the source's
//! redelivery window passes, or at once from a draining source (at least once; an inbox on the
//! consumer side makes it exactly once). Envelopes travel with
//! every stamp they were written with (the same [`MessageIdStamp`](crate::MessageIdStamp), bus
//! name, trace context...); only what describes the source delivery is dropped
//! ([`ReceivedStamp`](crate::ReceivedStamp), [`TransportMessageIdStamp`](crate::TransportMessageIdStamp), [`DeliveryTagStamp`](crate::DeliveryTagStamp), [`SentStamp`](crate::SentStamp)), and
//! the [`DelayStamp`](crate::DelayStamp), whose delay the source served already. A message whose type the relay
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

mod lockstep;
mod source;
mod steps;

pub use source::RelaySource;
pub use steps::Forward;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{Backoff, Transport, TransportError};

/// The batches a [`RelaySource`] may hold ahead of the one being sent, at most (a draining
/// source holds each in a transaction): [`Relay::hold_bound`] budgets for their sends.
pub const BATCHES_AHEAD: usize = 2;

/// The shortest [`Relay::hold_bound`], whatever the hold limit
/// ([`NO_ANSWER_AFTER`](crate::NO_ANSWER_AFTER), a minute): longer than any source's poll
/// window (a fetch waits it for its first message), and than a few sends and commits of
/// batches drained ahead.
const MIN_HOLD_BOUND: Duration = crate::transport::NO_ANSWER_AFTER;

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
    /// relay lets the batch go back to the source (and those drained ahead), waits the outage
    /// out by resending the batch from memory, holding nothing, then deletes its rows by id.
    ///
    /// It also bounds how long a relay cut off from its source keeps the rows it holds: each
    /// drain asks the source to end its hold once idle for four times this, a minute at least
    /// (a batch drained ahead waits behind the sends before it, each at most this long), and
    /// the relay gives up waiting on any call to its source (drain, commit, fetch, ack) after
    /// as long. So after a network partition between the relay and PostgreSQL, its batches
    /// are back in the outbox for another relay within two minutes at the default, and a relay
    /// whose connection went silent tries a new one after as long, not when TCP gives up. On
    /// a source read with `get` (SQLite, MySQL), each attempt to send a batch is given up at
    /// this limit and tried again, the batch kept alive first.
    pub hold_limit: Duration,
    probe: Option<Probe>,
}

/// What [`RelayOptions::on_point`] installs.
type ProbeFn = dyn Fn(RelayPoint) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

/// A [`RelayOptions::on_point`] callback (shown as `Probe` in `Debug`).
#[derive(Clone)]
struct Probe(Arc<ProbeFn>);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            batch_size: 100,
            lag_every: Duration::from_secs(5),
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(10)),
            limit: None,
            hold_limit: Duration::from_secs(30),
            probe: None,
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

    /// A fault-injection point for crash tests: the relay calls `probe` at each
    /// [`RelayPoint`] of every batch and awaits what it returns before going on, so a probe
    /// that never resolves holds the relay exactly there, to be killed. Nothing else in
    /// Courier installs one (the `courier` binary has none; the crash tests' own binary does,
    /// through `courier_cli::App::configure_relay`).
    #[must_use]
    pub fn on_point<F, Fut>(mut self, probe: F) -> Self
    where
        F: Fn(RelayPoint) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.probe = Some(Probe(Arc::new(move |point| Box::pin(probe(point)))));
        self
    }
}

/// The points of a batch where a [`RelayOptions::on_point`] probe is called. What is
/// described is the state of the first batch when a probe holds the relay there.
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
        self.to.send_batch(steps::outgoing(&batch, false)).await?;
        self.probe(RelayPoint::AfterConfirm).await;
        self.from.ack_batch(&batch).await?;
        self.done(batch.len());
        self.probe(RelayPoint::AfterDelete).await;
        Ok(batch.len())
    }

    /// Forwards batches, pipelined (see the [module docs](self)), until `shutdown` is
    /// cancelled or [`RelayOptions::limit`] messages are forwarded. On shutdown the step in
    /// flight finishes, then the batch fetched ahead is sent and acked too, rather than put
    /// back (putting it back would move it behind the rows not fetched yet): the stop takes at
    /// most the source's poll window plus two batches (three from a draining source, which
    /// drains two ahead). Transient failures are retried with
    /// [`RelayOptions::backoff`], the batch being sent kept alive at the source meanwhile.
    ///
    /// # Errors
    /// A failure that is not transient (a message the destination refuses, a missing table),
    /// or a transient one once `shutdown` is cancelled: the unacked batches stay at the source
    /// (delivered again after its redelivery window), so the relay stops there rather than
    /// skip them.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<RelayStats, TransportError> {
        if let Some(source) = self.from.as_relay_source() {
            return source.relay(self, &shutdown).await;
        }
        self.run_lockstep(&shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Envelope, InMemoryTransport, Message, PriorityStamp};
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

    #[tokio::test]
    async fn a_probe_is_awaited_at_each_point_of_each_batch() {
        let from = InMemoryTransport::new();
        let to = InMemoryTransport::new();
        for n in 0..4 {
            from.send(Envelope::new(Item { n }))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // Each call: the point, messages acked at the source, messages at the destination.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (source, dest, log) = (from.clone(), to.clone(), seen.clone());
        let options = RelayOptions::default().batch_size(2).on_point(move |at| {
            let (source, dest, log) = (source.clone(), dest.clone(), log.clone());
            async move {
                // Awaited: the relay goes on only once the probe is done.
                tokio::task::yield_now().await;
                let state = (at, source.acked().len(), dest.sent().len());
                log.lock().unwrap_or_else(|e| e.into_inner()).push(state);
            }
        });
        let relay = Relay::new("outbox", Arc::new(from), "to", Arc::new(to)).options(options);
        for _ in 0..2 {
            assert_eq!(
                relay.relay_batch().await.unwrap_or_else(|e| panic!("{e}")),
                2
            );
        }
        use RelayPoint::{AfterConfirm, AfterDelete};
        assert_eq!(
            *seen.lock().unwrap_or_else(|e| e.into_inner()),
            [
                (AfterConfirm, 0, 2),
                (AfterDelete, 2, 2),
                (AfterConfirm, 2, 4),
                (AfterDelete, 4, 4)
            ]
        );
    }
}
