//! The transport contract and the two in-process transports.
//!
//! A [`Transport`] moves envelopes between a sender and a worker: `send`, `get`, `ack`, `reject`,
//! `retry` and `keepalive`, plus batch forms for speed. Optional abilities (creating tables or
//! queues, listing stored messages, counting them) are traits of their own, offered through one
//! method, [`Transport::abilities`], so a transport is always usable as `Arc<dyn Transport>`.

mod abilities;
mod dedup;
mod factory;
mod gate;
mod keyed;
mod limiter;
mod memory;
mod pausable;
mod pause;
mod rate_limit;
mod sync;
mod workers;
mod workers_memory;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use abilities::Abilities;
pub use dedup::{Deduplicate, MemoryDeduplicator};
pub use factory::{FactoryContext, TransportFactory, TransportRegistry};
pub use keyed::KeyedQueue;
pub use limiter::{MemoryRateLimiter, RateLimit, RateLimiter, Taken};
pub use memory::{InMemoryOptions, InMemoryTransport};
pub use pausable::Pausable;
pub use pause::{PAUSE_CHECK, PauseGate};
pub use rate_limit::RateLimitGate;
pub use sync::SyncTransport;
pub use workers::{DEFAULT_WORKER_STALE_AFTER, Heartbeat, WorkerRecord, WorkerRegistry};
pub use workers_memory::{InMemoryWorkerRegistry, shared_worker_registry};

use crate::{DelayStamp, Envelope, RedeliveryStamp, TransportError, TransportErrorKind};

/// How long a call to a transport (an ack, a keepalive, a fetch beyond its own poll window)
/// may go unanswered before the worker or the relay gives it up as a transient
/// [`TransportErrorKind::Timeout`] and tries again: a minute. A connection that a failover, a
/// NAT's idle timeout or a network partition black-holed answers nothing, and TCP gives up on
/// it only after its retransmissions (about 15 minutes on Linux's defaults).
pub const NO_ANSWER_AFTER: Duration = Duration::from_secs(60);

/// Runs `call` (`doing` something on `transport`), giving it up after `limit` (when there is
/// one) with a [`TransportErrorKind::Timeout`] that says so.
pub(crate) async fn answered_within<T>(
    limit: Option<Duration>,
    transport: &str,
    doing: &str,
    call: impl Future<Output = Result<T, TransportError>>,
) -> Result<T, TransportError> {
    let Some(limit) = limit else {
        return call.await;
    };
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(
            TransportError::new(TransportErrorKind::Timeout, transport.to_owned()).with_context(
                format!("{doing}: no answer within {} ms", limit.as_millis()),
            ),
        )
    })
}

/// What a transport can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Honours [`DelayStamp`].
    pub delay: bool,
    /// The longest delay honoured, when limited.
    pub max_delay: Option<Duration>,
    /// Honours [`PriorityStamp`](crate::PriorityStamp).
    pub priority: bool,
    /// `get` blocks until a message arrives (up to its poll window) instead of returning at once.
    pub blocking_get: bool,
    /// How long a blocking `get` waits for a first message before it returns empty (its poll
    /// window), when known. The worker gives up a `get` that has not answered within this and
    /// [`NO_ANSWER_AFTER`] (a connection black-holed by a failover or a NAT answers nothing
    /// until TCP gives up, many minutes later); a transport whose `get` blocks for an unknown
    /// time (`blocking_get` without this) is waited on as long as it takes.
    pub get_wait: Option<Duration>,
    /// Messages received and never acknowledged come back after a redelivery window.
    pub redelivery: bool,
    /// The redelivery window, when the transport has one: a received message not acked, and not
    /// kept alive with [`Transport::keepalive`], is delivered again this long after it was
    /// received. The worker keeps every message it holds alive at a third of this window.
    pub redeliver_after: Option<Duration>,
    /// The server stops delivering while a bounded number of deliveries are unacked (AMQP's
    /// prefetch): the worker acks what is done before it fetches the next batch, rather than
    /// once the batch is done.
    pub bounded_unacked: bool,
    /// How many deliveries may be unacked at once, where the server bounds them (AMQP's
    /// prefetch): the worker acks in chunks of half of it (or of half its fetch size, if
    /// smaller), so the server refills one half while the other is handled, rather than
    /// answering each small ack with a small delivery.
    pub unacked_window: Option<usize>,
    /// [`Transport::ack_and_get`] acks and receives in one round trip (SQL: one transaction,
    /// one commit): the worker lets the acks of one batch ride on the fetch of the next.
    pub ack_with_get: bool,
}

impl Capabilities {
    /// No optional ability.
    #[must_use]
    pub const fn none() -> Self {
        Self {
            delay: false,
            max_delay: None,
            priority: false,
            blocking_get: false,
            get_wait: None,
            redelivery: false,
            redeliver_after: None,
            bounded_unacked: false,
            unacked_window: None,
            ack_with_get: false,
        }
    }

    /// Sets [`Capabilities::delay`].
    #[must_use]
    pub const fn with_delay(mut self, max: Option<Duration>) -> Self {
        self.delay = true;
        self.max_delay = max;
        self
    }

    /// Sets [`Capabilities::priority`].
    #[must_use]
    pub const fn with_priority(mut self) -> Self {
        self.priority = true;
        self
    }

    /// Sets [`Capabilities::blocking_get`].
    #[must_use]
    pub const fn with_blocking_get(mut self) -> Self {
        self.blocking_get = true;
        self
    }

    /// Sets [`Capabilities::blocking_get`] with its poll window, [`Capabilities::get_wait`].
    #[must_use]
    pub const fn with_get_wait(mut self, window: Duration) -> Self {
        self.blocking_get = true;
        self.get_wait = Some(window);
        self
    }

    /// How long a `get` (or an [`ack_and_get`](Transport::ack_and_get)) of this transport may
    /// go unanswered before a caller gives it up: its [`get_wait`](Self::get_wait) and
    /// [`NO_ANSWER_AFTER`]; `None` when it blocks for an unknown time.
    #[must_use]
    pub fn get_bound(&self) -> Option<Duration> {
        match (self.blocking_get, self.get_wait) {
            (false, _) => Some(NO_ANSWER_AFTER),
            (true, Some(wait)) => Some(wait.saturating_add(NO_ANSWER_AFTER)),
            (true, None) => None,
        }
    }

    /// Sets [`Capabilities::redelivery`].
    #[must_use]
    pub const fn with_redelivery(mut self) -> Self {
        self.redelivery = true;
        self
    }

    /// Sets [`Capabilities::redelivery`] with its window, [`Capabilities::redeliver_after`].
    #[must_use]
    pub const fn with_redeliver_after(mut self, window: Duration) -> Self {
        self.redelivery = true;
        self.redeliver_after = Some(window);
        self
    }

    /// Sets [`Capabilities::ack_with_get`].
    #[must_use]
    pub const fn with_ack_with_get(mut self) -> Self {
        self.ack_with_get = true;
        self
    }

    /// Sets [`Capabilities::bounded_unacked`].
    #[must_use]
    pub const fn with_bounded_unacked(mut self) -> Self {
        self.bounded_unacked = true;
        self
    }

    /// Sets [`Capabilities::unacked_window`] (and [`Capabilities::bounded_unacked`]).
    #[must_use]
    pub const fn with_unacked_window(mut self, window: usize) -> Self {
        self.bounded_unacked = true;
        self.unacked_window = Some(window);
        self
    }

    /// Checks that an envelope's [`DelayStamp`] can be honoured; transports call this in `send`.
    ///
    /// # Errors
    /// [`TransportErrorKind::Unsupported`] naming the delay and the limit.
    pub fn check_delay(&self, transport: &str, envelope: &Envelope) -> Result<(), TransportError> {
        let Some(DelayStamp(delay)) = envelope.last::<DelayStamp>() else {
            return Ok(());
        };
        if delay.is_zero() {
            return Ok(());
        }
        if !self.delay {
            return Err(
                TransportError::new(TransportErrorKind::Unsupported, transport.to_owned())
                    .with_context(format!(
                        "this transport cannot delay messages (DelayStamp of {delay:?})"
                    )),
            );
        }
        match self.max_delay {
            Some(max) if *delay > max => Err(TransportError::new(
                TransportErrorKind::Unsupported,
                transport.to_owned(),
            )
            .with_context(format!("delay of {delay:?} exceeds the maximum of {max:?}"))),
            _ => Ok(()),
        }
    }
}

/// A message transport: the contract every backend implements.
///
/// The methods follow Symfony Messenger's verbs. Implementations must pass the conformance suite
/// in `courier-test`. The provided methods are correct for any transport; override them when the
/// backend can do better (one UPDATE for `retry`, one multi-row INSERT for `send_batch`).
///
/// A minimal transport is in `examples/custom_transport.rs`; [`InMemoryTransport`] is a complete one.
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier transport",
    note = "implement `courier::Transport` (with `#[async_trait]`) for `{Self}`"
)]
pub trait Transport: Send + Sync + Debug {
    /// The messaging system behind this transport, as OpenTelemetry's `messaging.system` names
    /// it on Courier's spans (`sqlite`, `postgresql`, `mysql`, `redis`, `rabbitmq`, ...). The
    /// default, `courier`, says only that the message went through Courier.
    fn messaging_system(&self) -> &'static str {
        "courier"
    }

    /// Stores the envelope for delivery; returns it with a
    /// [`TransportMessageIdStamp`](crate::TransportMessageIdStamp).
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError>;

    /// Receives up to `max` envelopes, each with a
    /// [`TransportMessageIdStamp`](crate::TransportMessageIdStamp); may wait up to the
    /// transport's poll window for the first one, and returns an empty list when none came.
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError>;

    /// Removes a received envelope for good. Acking twice is not an error.
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError>;

    /// Removes a received envelope without handling it.
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError>;

    /// Puts a received envelope back for another delivery after `delay`, at least once: the
    /// default sends the (new) envelope with a [`DelayStamp`] first and acks the old delivery
    /// second, so a crash in between means a duplicate, never a loss.
    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let old = envelope.clone();
        let next = envelope.without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        self.send(next).await?;
        self.ack(&old).await
    }

    /// Acks `acks`, then receives up to `max` like [`Transport::get`]: in one round trip where
    /// the backend can ([`Capabilities::ack_with_get`]). The default acks with
    /// [`Transport::ack_batch`], then gets. On an error the acks may or may not have happened:
    /// the caller acks them again (acking twice is not an error). `max` 0 acks only.
    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        if !acks.is_empty() {
            self.ack_batch(acks).await?;
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        self.get(max).await
    }

    /// Tells the transport the envelope is still being worked on (extends its redelivery window).
    async fn keepalive(&self, _envelope: &Envelope) -> Result<(), TransportError> {
        Ok(())
    }

    /// Keeps several received envelopes alive (what the worker calls for everything it holds).
    /// The default loops over [`Transport::keepalive`] and stops at the first error.
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        for envelope in envelopes {
            self.keepalive(envelope).await?;
        }
        Ok(())
    }

    /// Sends several envelopes; returns them in order, each with its id. The default loops and
    /// stops at the first error (the envelopes before it are sent).
    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        let mut sent = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            sent.push(self.send(envelope).await?);
        }
        Ok(sent)
    }

    /// Acks several envelopes. The default loops and stops at the first error.
    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        for envelope in envelopes {
            self.ack(envelope).await?;
        }
        Ok(())
    }

    /// What the transport can do beyond the verbs: its optional abilities, each a trait of
    /// its own ([`Setup`], [`Listable`], [`MessageCount`], ...), reached through
    /// `dyn Transport`'s accessors (`transport.as_setup()`, ...). The one extension point
    /// beside the verbs; the default offers none.
    fn abilities(&self) -> Abilities<'_> {
        Abilities::none()
    }

    /// What the transport can do.
    fn capabilities(&self) -> Capabilities;
}

/// Creates what a transport needs on its server. Idempotent.
#[async_trait]
pub trait Setup: Send + Sync {
    /// Creates tables / queues / streams / groups, doing nothing for those that exist.
    async fn setup(&self) -> Result<(), TransportError>;

    /// [`Setup::setup`], naming what was applied since the transport connected (migration
    /// versions, for a transport that migrates its tables when it connects): what `courier
    /// setup` reports. The default sets up and names nothing.
    async fn setup_report(&self) -> Result<Vec<String>, TransportError> {
        self.setup().await.map(|()| Vec::new())
    }

    /// Checks, creating nothing, that what [`Setup::setup`] would create is there, for a
    /// transport told not to set itself up (`auto_setup = false`): a worker calls it at startup
    /// so that a missing or older schema stops it at once with an error naming what is missing
    /// ([`TransportErrorKind::Config`]), not at its first message. The default finds nothing
    /// missing.
    async fn check(&self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// Browsing stored messages: what `courier failed show / retry / remove` uses.
#[async_trait]
pub trait Listable: Send + Sync {
    /// Up to `limit` stored messages, oldest first, without claiming them.
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError>;
    /// The stored message with this transport id.
    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError>;
    /// Removes the stored message with this id; `false` when there was none.
    async fn remove(&self, id: &str) -> Result<bool, TransportError>;
}

/// Several queues behind one transport (SQL `queue_name`s in one table, AMQP queues): what
/// `courier consume --queues a,b` uses (Messenger's `QueueReceiverInterface`).
#[async_trait]
pub trait Queues: Send + Sync {
    /// A transport that receives from `queue` only (and sends there); it shares this
    /// transport's connections where it can.
    async fn queue(&self, queue: &str) -> Result<Arc<dyn Transport>, TransportError>;
}

/// Counting messages.
#[async_trait]
pub trait MessageCount: Send + Sync {
    /// The number of messages waiting or in flight (exact when the transport is idle).
    async fn message_count(&self) -> Result<u64, TransportError>;

    /// How long the oldest waiting message has been stored (`None`: the queue is empty, or the
    /// transport cannot tell). For an outbox queue this is the relay's lag.
    async fn oldest_age(&self) -> Result<Option<Duration>, TransportError> {
        Ok(None)
    }
}

// Compile-time proof that the traits are object safe and `dyn Transport` is `Send + Sync`.
const _: () = {
    fn _obj_safe(
        _: &dyn Transport,
        _: &dyn Setup,
        _: &dyn Listable,
        _: &dyn MessageCount,
        _: &dyn Queues,
        _: &dyn Deduplicate,
        _: &dyn KeyedQueue,
    ) {
    }
    fn _send_sync<T: Send + Sync + ?Sized>() {}
    fn _dyn_transport_is_send_sync() {
        _send_sync::<dyn Transport>();
    }
};

/// The retry count an envelope carries (0 when it was never retried).
#[must_use]
pub fn retry_count(envelope: &Envelope) -> u32 {
    envelope
        .last::<RedeliveryStamp>()
        .map_or(0, |s| s.retry_count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_is_given_up_a_minute_past_its_own_wait() {
        assert_eq!(Capabilities::none().get_bound(), Some(NO_ANSWER_AFTER));
        assert_eq!(
            Capabilities::none()
                .with_get_wait(Duration::from_secs(5))
                .get_bound(),
            Some(Duration::from_secs(65))
        );
        assert_eq!(
            Capabilities::none().with_blocking_get().get_bound(),
            None,
            "a get that blocks for an unknown time is not cut"
        );
    }
}
