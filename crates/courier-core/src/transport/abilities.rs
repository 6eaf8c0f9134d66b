//! What a transport can do beyond Symfony's verbs: its optional abilities, each a trait of its
//! own, offered through one method, [`Transport::abilities`].

use std::any::Any;

use super::{
    Deduplicate, KeyedQueue, Listable, MessageCount, Pausable, Queues, RateLimiter, Setup,
    Transport, WorkerRegistry,
};
use crate::relay::RelaySource;
use crate::schedule::ScheduleStore;

/// The optional abilities of a transport: the one extension point of [`Transport`] beside its
/// verbs. A transport offers what it implements, each ability a trait of its own; callers
/// reach them through `dyn Transport`'s accessors ([`as_setup`](Self::setup),
/// `transport.as_listable()`, ...).
///
/// ```
/// use courier_core::{Abilities, MessageCount, Transport, TransportError, async_trait};
///
/// #[derive(Debug)]
/// struct Counted;
///
/// #[async_trait]
/// impl MessageCount for Counted {
///     async fn message_count(&self) -> Result<u64, TransportError> {
///         Ok(0)
///     }
/// }
///
/// // In `impl Transport for Counted`:
/// fn abilities(counted: &Counted) -> Abilities<'_> {
///     Abilities::none().message_count(counted)
/// }
/// assert!(abilities(&Counted).message_count.is_some());
/// assert!(abilities(&Counted).setup.is_none());
/// ```
#[derive(Clone, Copy, Default)]
#[non_exhaustive]
pub struct Abilities<'a> {
    /// Creating tables, queues or consumer groups, if the transport needs it.
    pub setup: Option<&'a dyn Setup>,
    /// Listing, finding and removing stored messages (what a failure transport needs).
    pub listable: Option<&'a dyn Listable>,
    /// Counting waiting messages.
    pub message_count: Option<&'a dyn MessageCount>,
    /// Receiving from one of several queues behind this transport (`consume --queues`).
    pub queues: Option<&'a dyn Queues>,
    /// The worker registry in this transport's store (a table, a hash), where workers announce
    /// themselves for `courier workers` and `courier stop-workers`.
    pub worker_registry: Option<&'a dyn WorkerRegistry>,
    /// The deduplication store beside this transport's messages, for
    /// [`DeduplicateStamp`](crate::DeduplicateStamp) (SQL, Redis, in-memory).
    pub deduplicate: Option<&'a dyn Deduplicate>,
    /// The schedule store in this transport's store (a table, a key per schedule), where the
    /// workers share the leases and last fired ticks of the recurring schedules.
    pub schedule_store: Option<&'a dyn ScheduleStore>,
    /// Pausing this transport's queue (`courier pause`), the flag in the transport's server.
    pub pausable: Option<&'a dyn Pausable>,
    /// The rate-limit bucket of this transport's queue in its server (an SQL row, a Redis
    /// key), shared by every worker of the queue (see [`RateLimitGate`](super::RateLimitGate)).
    pub rate_limiter: Option<&'a dyn RateLimiter>,
    /// The source's own way of being relayed ([`RelaySource`]: SQL on PostgreSQL drains its
    /// outbox, or reads it by a cursor), which [`Relay::run`](crate::relay::Relay::run) uses
    /// instead of `get` then `ack_batch`.
    pub relay_source: Option<&'a dyn RelaySource>,
    /// The loads of a queue's concurrency keys, offered only by a queue with flow control per
    /// key (`courier stats --keys`, the dashboard, the per-key gauges).
    pub keyed_queue: Option<&'a dyn KeyedQueue>,
    /// The transport as [`Any`], for code that needs its concrete type (the SQL transport's
    /// `dispatch_in` finds the SQL transports a message is routed to).
    pub any: Option<&'a dyn Any>,
}

impl std::fmt::Debug for Abilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let offered = [
            ("setup", self.setup.is_some()),
            ("listable", self.listable.is_some()),
            ("message_count", self.message_count.is_some()),
            ("queues", self.queues.is_some()),
            ("worker_registry", self.worker_registry.is_some()),
            ("deduplicate", self.deduplicate.is_some()),
            ("schedule_store", self.schedule_store.is_some()),
            ("pausable", self.pausable.is_some()),
            ("rate_limiter", self.rate_limiter.is_some()),
            ("relay_source", self.relay_source.is_some()),
            ("keyed_queue", self.keyed_queue.is_some()),
            ("any", self.any.is_some()),
        ];
        f.debug_list()
            .entries(offered.iter().filter(|(_, on)| *on).map(|(name, _)| name))
            .finish()
    }
}

impl<'a> Abilities<'a> {
    /// No optional ability.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// Offers [`Abilities::setup`].
    #[must_use]
    pub fn setup(mut self, ability: &'a dyn Setup) -> Self {
        self.setup = Some(ability);
        self
    }

    /// Offers [`Abilities::listable`].
    #[must_use]
    pub fn listable(mut self, ability: &'a dyn Listable) -> Self {
        self.listable = Some(ability);
        self
    }

    /// Offers [`Abilities::message_count`].
    #[must_use]
    pub fn message_count(mut self, ability: &'a dyn MessageCount) -> Self {
        self.message_count = Some(ability);
        self
    }

    /// Offers [`Abilities::queues`].
    #[must_use]
    pub fn queues(mut self, ability: &'a dyn Queues) -> Self {
        self.queues = Some(ability);
        self
    }

    /// Offers [`Abilities::worker_registry`].
    #[must_use]
    pub fn worker_registry(mut self, ability: &'a dyn WorkerRegistry) -> Self {
        self.worker_registry = Some(ability);
        self
    }

    /// Offers [`Abilities::deduplicate`].
    #[must_use]
    pub fn deduplicate(mut self, ability: &'a dyn Deduplicate) -> Self {
        self.deduplicate = Some(ability);
        self
    }

    /// Offers [`Abilities::schedule_store`].
    #[must_use]
    pub fn schedule_store(mut self, ability: &'a dyn ScheduleStore) -> Self {
        self.schedule_store = Some(ability);
        self
    }

    /// Offers [`Abilities::pausable`].
    #[must_use]
    pub fn pausable(mut self, ability: &'a dyn Pausable) -> Self {
        self.pausable = Some(ability);
        self
    }

    /// Offers [`Abilities::rate_limiter`].
    #[must_use]
    pub fn rate_limiter(mut self, ability: &'a dyn RateLimiter) -> Self {
        self.rate_limiter = Some(ability);
        self
    }

    /// Offers [`Abilities::relay_source`].
    #[must_use]
    pub fn relay_source(mut self, ability: &'a dyn RelaySource) -> Self {
        self.relay_source = Some(ability);
        self
    }

    /// Offers [`Abilities::keyed_queue`].
    #[must_use]
    pub fn keyed_queue(mut self, ability: &'a dyn KeyedQueue) -> Self {
        self.keyed_queue = Some(ability);
        self
    }

    /// Offers [`Abilities::any`].
    #[must_use]
    pub fn any(mut self, ability: &'a dyn Any) -> Self {
        self.any = Some(ability);
        self
    }

    /// What a receiver wrapper (a pause or rate-limit gate) passes on of its inner transport's
    /// abilities: all but its concrete type, its rate limiter and its relay source (a gated
    /// source is read through `get`, which the gate governs).
    #[must_use]
    pub(crate) fn through_gate(self) -> Self {
        Self {
            any: None,
            rate_limiter: None,
            relay_source: None,
            ..self
        }
    }
}

/// The accessors of the optional abilities ([`Transport::abilities`]).
impl dyn Transport + '_ {
    /// [`Abilities::setup`].
    #[must_use]
    pub fn as_setup(&self) -> Option<&dyn Setup> {
        self.abilities().setup
    }

    /// [`Abilities::listable`].
    #[must_use]
    pub fn as_listable(&self) -> Option<&dyn Listable> {
        self.abilities().listable
    }

    /// [`Abilities::message_count`].
    #[must_use]
    pub fn as_message_count(&self) -> Option<&dyn MessageCount> {
        self.abilities().message_count
    }

    /// [`Abilities::keyed_queue`].
    #[must_use]
    pub fn as_keyed_queue(&self) -> Option<&dyn KeyedQueue> {
        self.abilities().keyed_queue
    }

    /// [`Abilities::queues`].
    #[must_use]
    pub fn as_queues(&self) -> Option<&dyn Queues> {
        self.abilities().queues
    }

    /// [`Abilities::worker_registry`].
    #[must_use]
    pub fn as_worker_registry(&self) -> Option<&dyn WorkerRegistry> {
        self.abilities().worker_registry
    }

    /// [`Abilities::deduplicate`].
    #[must_use]
    pub fn as_deduplicate(&self) -> Option<&dyn Deduplicate> {
        self.abilities().deduplicate
    }

    /// [`Abilities::schedule_store`].
    #[must_use]
    pub fn as_schedule_store(&self) -> Option<&dyn ScheduleStore> {
        self.abilities().schedule_store
    }

    /// [`Abilities::pausable`].
    #[must_use]
    pub fn as_pausable(&self) -> Option<&dyn Pausable> {
        self.abilities().pausable
    }

    /// [`Abilities::rate_limiter`].
    #[must_use]
    pub fn as_rate_limiter(&self) -> Option<&dyn RateLimiter> {
        self.abilities().rate_limiter
    }

    /// [`Abilities::relay_source`].
    #[must_use]
    pub fn as_relay_source(&self) -> Option<&dyn RelaySource> {
        self.abilities().relay_source
    }

    /// [`Abilities::any`].
    #[must_use]
    pub fn as_any(&self) -> Option<&dyn Any> {
        self.abilities().any
    }
}
