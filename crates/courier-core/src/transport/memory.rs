//! `in-memory://`: a transport for tests, recording what was sent, acked and rejected.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Capabilities, Listable, MessageCount, Setup, Transport};
use crate::envelope::Slot;
use crate::{
    DelayStamp, DeliveryTagStamp, Encoded, Envelope, MessageRegistry, PriorityStamp,
    TransportError, TransportErrorKind, TransportMessageIdStamp,
};

/// Options of [`InMemoryTransport`] (DSN query:
/// `in-memory://?redeliver_timeout=30s&serialize=true&serializer=msgpack`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InMemoryOptions {
    /// The transport's name in errors. Default `"in-memory"`.
    pub name: String,
    /// How long a received, unacknowledged message stays invisible (the worker keeps
    /// what it holds alive). Default 30 s.
    pub redeliver_timeout: Duration,
    /// Encode on send and decode on get, as a real transport would (needs a registry).
    /// Default false: envelopes are stored as values, without their local stamps.
    pub serialize: bool,
    /// The body serializer in serialize mode (DSN `serializer`, which also turns serialize mode
    /// on). Default JSON.
    pub serializer: crate::Serializer,
}

impl Default for InMemoryOptions {
    fn default() -> Self {
        Self {
            name: "in-memory".into(),
            redeliver_timeout: Duration::from_secs(30),
            serialize: false,
            serializer: crate::Serializer::Json,
        }
    }
}

impl InMemoryOptions {
    /// Sets the name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the redelivery timeout.
    #[must_use]
    pub fn redeliver_timeout(mut self, timeout: Duration) -> Self {
        self.redeliver_timeout = timeout;
        self
    }

    /// Sets the body serializer of serialize mode.
    #[must_use]
    pub fn serializer(mut self, serializer: crate::Serializer) -> Self {
        self.serializer = serializer;
        self
    }

    /// Sets serialize mode.
    #[must_use]
    pub fn serialize(mut self, serialize: bool) -> Self {
        self.serialize = serialize;
        self
    }
}

type Key = (Reverse<u8>, Instant, u64);

enum Stored {
    Value(Envelope),
    Wire(Encoded),
}

struct Entry {
    stored: Stored,
    key: Key,
    delivery: Option<(u64, Instant)>,
}

/// One send, as recorded: the envelope with its id, and whether it was a dispatch or a worker's
/// [`Transport::retry`] (a retry, or an unstarted message released on stop), which the
/// assertions of [`crate::testing`] leave out.
#[derive(Clone)]
pub(crate) struct SentRecord {
    pub(crate) envelope: Envelope,
    pub(crate) retry: bool,
    /// Checked off by an `assert_dispatched*` call.
    pub(crate) checked: bool,
}

#[derive(Default)]
struct State {
    next_id: u64,
    next_delivery: u64,
    entries: HashMap<u64, Entry>,
    ready: BTreeSet<Key>,
    /// Live deliveries by deadline, so expiry is found without scanning every entry.
    deliveries: BTreeSet<(Instant, u64)>,
    sent: Vec<SentRecord>,
    acked: Vec<Envelope>,
    rejected: Vec<Envelope>,
}

/// A transport that keeps messages in memory: for tests and examples.
///
/// Honours [`DelayStamp`] and [`PriorityStamp`] on tokio's clock (so `tokio::time::pause` makes
/// delay tests instant), redelivers messages not acked within `redeliver_timeout`, and records
/// every envelope sent, acked and rejected for assertions: see [`crate::testing`] for typed
/// assertions on what was dispatched ([`InMemoryTransport::assert_dispatched`]).
///
/// ```
/// use courier_core::{Envelope, InMemoryTransport, Message, Transport};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Ping;
/// impl Message for Ping { const NAME: &'static str = "app.ping"; }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let transport = InMemoryTransport::new();
/// transport.send(Envelope::new(Ping)).await?;
/// let received = transport.get(10).await?;
/// transport.ack(&received[0]).await?;
/// assert_eq!(transport.sent().len(), 1);
/// assert_eq!(transport.acked().len(), 1);
/// # Ok::<(), courier_core::TransportError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct InMemoryTransport {
    options: Arc<InMemoryOptions>,
    registry: Arc<MessageRegistry>,
    state: Arc<Mutex<State>>,
    dedup: super::MemoryDeduplicator,
    /// The queue's rate-limit bucket, shared by its clones (the workers of this process).
    limits: super::MemoryRateLimiter,
    /// Woken at every send, ack and reject (shared by its clones): what a fetch waits on in
    /// [`crate::testing::run_until_empty`].
    changed: Arc<tokio::sync::Notify>,
}

impl fmt::Debug for InMemoryTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Default for InMemoryTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryTransport {
    /// A transport with default options that stores envelopes as values.
    #[must_use]
    pub fn new() -> Self {
        Self::with_options(InMemoryOptions::default(), Arc::new(MessageRegistry::new()))
    }

    /// A transport with options; `registry` decodes messages in serialize mode and for
    /// [`InMemoryTransport::send_raw`].
    #[must_use]
    pub fn with_options(options: InMemoryOptions, registry: Arc<MessageRegistry>) -> Self {
        Self {
            options: Arc::new(options),
            registry,
            state: Arc::default(),
            dedup: super::MemoryDeduplicator::new(),
            limits: super::MemoryRateLimiter::new(),
            changed: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every envelope sent, in order (with its id).
    #[must_use]
    pub fn sent(&self) -> Vec<Envelope> {
        self.lock()
            .sent
            .iter()
            .map(|r| r.envelope.clone())
            .collect()
    }

    /// The transport's name in errors and assertion messages.
    pub(crate) fn name(&self) -> &str {
        &self.options.name
    }

    /// Every send recorded, in order.
    pub(crate) fn records(&self) -> Vec<SentRecord> {
        self.lock().sent.clone()
    }

    /// What is woken at every send, ack and reject.
    pub(crate) fn changed(&self) -> &tokio::sync::Notify {
        &self.changed
    }

    /// The earliest moment something stored becomes due: a delayed message, or a delivery whose
    /// redelivery window ends (`None`: nothing is stored).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        let st = self.lock();
        let ready = st.ready.iter().map(|k| k.1).min();
        let redelivery = st.deliveries.first().map(|d| d.0);
        ready.into_iter().chain(redelivery).min()
    }

    /// Checks off the record at `index` (if it is still there: a [`Self::reset`] forgets it).
    pub(crate) fn check_off(&self, index: usize) {
        if let Some(r) = self.lock().sent.get_mut(index) {
            r.checked = true;
        }
    }

    /// Every envelope acked, in order.
    #[must_use]
    pub fn acked(&self) -> Vec<Envelope> {
        self.lock().acked.clone()
    }

    /// Every envelope rejected, in order.
    #[must_use]
    pub fn rejected(&self) -> Vec<Envelope> {
        self.lock().rejected.clone()
    }

    /// Forgets every stored message and every record.
    pub fn reset(&self) {
        *self.lock() = State::default();
    }

    /// Stores a message in wire form, exactly as a producer in another language would.
    pub fn send_raw(&self, encoded: Encoded) -> String {
        let mut st = self.lock();
        let id = Self::insert(&mut st, Stored::Wire(encoded), 0, Duration::ZERO);
        drop(st);
        self.changed.notify_waiters();
        id.to_string()
    }

    fn insert(st: &mut State, stored: Stored, priority: u8, delay: Duration) -> u64 {
        st.next_id += 1;
        let id = st.next_id;
        let key = (Reverse(priority), Instant::now() + delay, id);
        st.ready.insert(key);
        st.entries.insert(
            id,
            Entry {
                stored,
                key,
                delivery: None,
            },
        );
        id
    }

    /// Stores `envelope` (a dispatch, or a worker's retry) and records the send.
    fn store(&self, envelope: Envelope, retry: bool) -> Result<Envelope, TransportError> {
        self.capabilities()
            .check_delay(&self.options.name, &envelope)?;
        let delay = envelope
            .last::<DelayStamp>()
            .map_or(Duration::ZERO, |d| d.0);
        let priority = envelope.last::<PriorityStamp>().map_or(0, |p| p.0);
        let stored = if self.options.serialize {
            Stored::Wire(
                crate::codec::encode_with(&envelope, self.options.serializer)
                    .map_err(|e| self.error(TransportErrorKind::Encode).with_source(e))?,
            )
        } else {
            Stored::Value(Self::strip_local(envelope.clone()))
        };
        let mut st = self.lock();
        let id = Self::insert(&mut st, stored, priority, delay);
        let sent = envelope.with(TransportMessageIdStamp(id.to_string()));
        st.sent.push(SentRecord {
            envelope: sent.clone(),
            retry,
            checked: false,
        });
        drop(st);
        self.changed.notify_waiters();
        Ok(sent)
    }

    fn error(&self, kind: TransportErrorKind) -> TransportError {
        TransportError::new(kind, self.options.name.clone())
    }

    fn strip_local(mut envelope: Envelope) -> Envelope {
        envelope.stamps.retain(|s| match s {
            Slot::Typed(s) => s.sendable(),
            Slot::Raw(_) => true,
        });
        envelope
    }

    fn materialize(&self, stored: &Stored) -> Envelope {
        match stored {
            Stored::Value(e) => e.clone(),
            Stored::Wire(w) => self.registry.decode(w.clone()),
        }
    }

    fn delivery_of(envelope: &Envelope) -> Option<(u64, u64)> {
        let id = envelope.last::<TransportMessageIdStamp>()?.0.parse().ok()?;
        let tag = envelope.last::<DeliveryTagStamp>()?.0.parse().ok()?;
        Some((id, tag))
    }

    fn remove_delivery(&self, envelope: &Envelope) -> Option<Envelope> {
        let (id, tag) = Self::delivery_of(envelope)?;
        let mut st = self.lock();
        let live = st
            .entries
            .get(&id)
            .and_then(|e| e.delivery)
            .is_some_and(|(d, _)| d == tag);
        if !live {
            return None;
        }
        if let Some((_, deadline)) = st.entries.remove(&id).and_then(|e| e.delivery) {
            st.deliveries.remove(&(deadline, id));
        }
        Some(envelope.clone())
    }
}

#[async_trait]
impl Transport for InMemoryTransport {
    fn messaging_system(&self) -> &'static str {
        "in_memory"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.store(envelope, false)
    }

    /// [`Transport::retry`]'s default, with the send recorded as a retry, not a dispatch.
    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let old = envelope.clone();
        let next = envelope.without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        self.store(next, true)?;
        self.ack(&old).await
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let now = Instant::now();
        let mut st = self.lock();
        while let Some(&(deadline, id)) = st.deliveries.first() {
            if deadline > now {
                break;
            }
            st.deliveries.pop_first();
            if let Some(e) = st.entries.get_mut(&id) {
                e.delivery = None;
                let key = e.key;
                st.ready.insert(key);
            }
        }
        let due: Vec<Key> = st
            .ready
            .iter()
            .filter(|k| k.1 <= now)
            .take(max)
            .copied()
            .collect();
        let mut out = Vec::with_capacity(due.len());
        for key in due {
            st.ready.remove(&key);
            st.next_delivery += 1;
            let tag = st.next_delivery;
            let deadline = now + self.options.redeliver_timeout;
            let Some(entry) = st.entries.get_mut(&key.2) else {
                continue;
            };
            entry.delivery = Some((tag, deadline));
            let env = self.materialize(&entry.stored);
            st.deliveries.insert((deadline, key.2));
            out.push(
                env.with(TransportMessageIdStamp(key.2.to_string()))
                    .with(DeliveryTagStamp(tag.to_string())),
            );
        }
        Ok(out)
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if let Some(env) = self.remove_delivery(envelope) {
            self.lock().acked.push(env);
            self.changed.notify_waiters();
        }
        Ok(())
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if let Some(env) = self.remove_delivery(envelope) {
            self.lock().rejected.push(env);
            self.changed.notify_waiters();
        }
        Ok(())
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let Some((id, tag)) = Self::delivery_of(envelope) else {
            return Ok(());
        };
        let deadline = Instant::now() + self.options.redeliver_timeout;
        let mut st = self.lock();
        let Some(e) = st.entries.get_mut(&id) else {
            return Ok(());
        };
        let Some((d, old)) = e.delivery else {
            return Ok(());
        };
        if d == tag {
            e.delivery = Some((d, deadline));
            st.deliveries.remove(&(old, id));
            st.deliveries.insert((deadline, id));
        }
        Ok(())
    }

    fn abilities(&self) -> super::Abilities<'_> {
        super::Abilities::none()
            .setup(self)
            .listable(self)
            .message_count(self)
            .deduplicate(&self.dedup)
            .rate_limiter(&self.limits)
            .any(self)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_delay(None)
            .with_priority()
            .with_redeliver_after(self.options.redeliver_timeout)
    }
}

#[async_trait]
impl Setup for InMemoryTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        Ok(())
    }
}

#[async_trait]
impl MessageCount for InMemoryTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        Ok(self.lock().entries.len() as u64)
    }
}

#[async_trait]
impl Listable for InMemoryTransport {
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError> {
        let st = self.lock();
        let mut ids: Vec<u64> = st.entries.keys().copied().collect();
        ids.sort_unstable();
        Ok(ids
            .into_iter()
            .take(limit)
            .filter_map(|id| {
                st.entries.get(&id).map(|e| {
                    self.materialize(&e.stored)
                        .with(TransportMessageIdStamp(id.to_string()))
                })
            })
            .collect())
    }

    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError> {
        let Ok(num) = id.parse::<u64>() else {
            return Ok(None);
        };
        let st = self.lock();
        Ok(st.entries.get(&num).map(|e| {
            self.materialize(&e.stored)
                .with(TransportMessageIdStamp(id.to_owned()))
        }))
    }

    async fn remove(&self, id: &str) -> Result<bool, TransportError> {
        let Ok(num) = id.parse::<u64>() else {
            return Ok(false);
        };
        let mut st = self.lock();
        match st.entries.remove(&num) {
            Some(e) => {
                st.ready.remove(&e.key);
                if let Some((_, deadline)) = e.delivery {
                    st.deliveries.remove(&(deadline, num));
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
