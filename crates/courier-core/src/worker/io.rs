//! The worker's I/O that runs beside the handlers, on tasks of its own: the ack flusher and the
//! keepalive of every message the worker holds.
//!
//! Neither ever waits on a handler, and no handler (nor the grace timer) ever waits on them: an
//! ack stalled on a dead server delays only the acks behind it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::{Listener, WorkerEvent};
use crate::transport::{NO_ANSWER_AFTER, answered_within};
use crate::{Envelope, Transport};

/// Every envelope the worker holds (fetched and not yet settled), started or not, by key.
///
/// The keepalive task keeps each of them alive, so a transport's redelivery window can be short:
/// a dead worker's messages come back within it, a live worker's slow ones do not. A slab: keys
/// are slot indices, reused once released (each key is released exactly once: by its ack flush,
/// its settle, its release, or the final drain), so holding costs no hashing.
#[derive(Debug)]
pub(super) struct Held {
    slots: Mutex<Slots>,
    /// Whether envelopes are kept (for the keepalive, or for naming what is left at the end);
    /// otherwise only counted.
    keep: bool,
}

#[derive(Debug, Default)]
struct Slots {
    entries: Vec<Option<(usize, Option<Envelope>)>>,
    free: Vec<u64>,
}

impl Held {
    /// An empty set; `keep`: whether the envelopes themselves are needed.
    pub(super) fn new(keep: bool) -> Self {
        Self {
            slots: Mutex::new(Slots::default()),
            keep,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds an envelope received from receiver `receiver`; returns its key.
    pub(super) fn hold(&self, receiver: usize, envelope: &Envelope) -> u64 {
        let entry = Some((receiver, self.keep.then(|| envelope.clone())));
        let mut slots = self.lock();
        if let Some(key) = slots.free.pop() {
            if let Some(slot) = usize::try_from(key)
                .ok()
                .and_then(|i| slots.entries.get_mut(i))
            {
                *slot = entry;
            }
            key
        } else {
            slots.entries.push(entry);
            (slots.entries.len() - 1) as u64
        }
    }

    /// Lets go of envelopes (settled, or given up on).
    pub(super) fn release_keys(&self, keys: impl IntoIterator<Item = u64>) {
        let mut slots = self.lock();
        for key in keys {
            let taken = usize::try_from(key)
                .ok()
                .and_then(|i| slots.entries.get_mut(i))
                .and_then(Option::take);
            if taken.is_some() {
                slots.free.push(key);
            }
        }
    }

    /// Takes every envelope still held, with its receiver (`None` where envelopes are not kept).
    pub(super) fn drain(&self) -> Vec<(usize, Option<Envelope>)> {
        let mut slots = self.lock();
        slots.free.clear();
        slots.entries.drain(..).flatten().collect()
    }

    /// The held envelopes of each receiver.
    fn snapshot(&self, receivers: usize) -> Vec<Vec<Envelope>> {
        let mut out = vec![Vec::new(); receivers];
        for (receiver, envelope) in self.lock().entries.iter().flatten() {
            if let (Some(list), Some(envelope)) = (out.get_mut(*receiver), envelope) {
                list.push(envelope.clone());
            }
        }
        out
    }
}

/// What the ack flusher of one receiver reports when it ends.
#[derive(Debug, Default)]
pub(super) struct AckStats {
    /// Envelopes whose ack failed: they will be delivered again.
    pub(super) failed: u64,
}

/// The sending half of one receiver's ack flusher.
///
/// The loop gathers acks itself (a batch is handed over when it is done, when `linger` has
/// passed since its first ack, or when it is full), so the flusher wakes once per batch, not
/// once per message.
#[derive(Debug)]
pub(super) struct Acker {
    tx: mpsc::UnboundedSender<Vec<(u64, Envelope)>>,
    pending: Vec<(u64, Envelope)>,
}

impl Acker {
    /// Adds an envelope to the batch being gathered; `key` is released from [`Held`] once it is
    /// flushed. Returns whether it was the batch's first (time to start the linger).
    pub(super) fn push(&mut self, key: u64, envelope: Envelope) -> bool {
        self.pending.push((key, envelope));
        self.pending.len() == 1
    }

    /// Acks waiting to be handed over.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes the gathered batch, for a caller that acks it itself.
    pub(super) fn take(&mut self) -> Vec<(u64, Envelope)> {
        std::mem::take(&mut self.pending)
    }

    /// Hands the gathered batch to the flusher.
    pub(super) fn flush(&mut self) {
        if !self.pending.is_empty() {
            // The flusher outlives the loop that sends to it; a closed channel cannot happen
            // while the worker runs, and would only mean redelivery.
            let _ = self.tx.send(std::mem::take(&mut self.pending));
        }
    }
}

/// Starts the ack flusher of one receiver: it flushes each batch it is handed with one
/// `ack_batch` (batches that queued up meanwhile go together, up to `max_batch`).
pub(super) fn spawn_acker(
    name: String,
    transport: Arc<dyn Transport>,
    held: Arc<Held>,
    listeners: Vec<Listener>,
    max_batch: usize,
) -> (Acker, JoinHandle<AckStats>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<(u64, Envelope)>>();
    let task = async move {
        let batch_size = metrics::histogram!(crate::metrics::ACK_BATCH_SIZE, crate::metrics::TRANSPORT => name.clone());
        let mut stats = AckStats::default();
        let mut batch = Vec::new();
        while let Some(first) = rx.recv().await {
            let (mut keys, mut envelopes): (Vec<u64>, Vec<Envelope>) = first.into_iter().unzip();
            while envelopes.len() < max_batch {
                let Ok(more) = rx.try_recv() else { break };
                for (key, envelope) in more {
                    keys.push(key);
                    envelopes.push(envelope);
                }
            }
            std::mem::swap(&mut batch, &mut envelopes);
            #[allow(clippy::cast_precision_loss)]
            batch_size.record(batch.len() as f64);
            let span = settle_span("ack", &name, &*transport, batch.len());
            // A server that stopped answering would hold every later ack behind this one
            // (and the worker's messages with them, kept alive): given up after a minute, the
            // batch is left for redelivery.
            let call = transport.ack_batch(&batch).instrument(span);
            if let Err(e) = answered_within(Some(NO_ANSWER_AFTER), &name, "acking", call).await {
                tracing::warn!(messaging.destination.name = %name, error = %crate::error_chain(&e), count = batch.len(), "ack failed; the messages will be redelivered");
                let event = WorkerEvent::TransportError {
                    transport: name.clone(),
                    error: crate::error_chain(&e).to_string(),
                };
                for l in &listeners {
                    l(&event);
                }
                stats.failed += batch.len() as u64;
            }
            held.release_keys(keys);
            batch.clear();
        }
        stats
    };
    (
        Acker {
            tx,
            pending: Vec::new(),
        },
        tokio::spawn(task),
    )
}

/// A task aborted when its handle is dropped: a worker whose `run` future is dropped (a task
/// aborted in-process) must not leave a keepalive behind that holds its messages forever, nor
/// a relay a send that outlives its attempt.
#[derive(Debug)]
pub(crate) struct AbortOnDrop<T>(pub(crate) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the keepalive task: every `interval` it calls `keepalive_batch` for every envelope the
/// worker holds, each call bounded by the interval so a stalled server delays only itself.
pub(super) fn spawn_keepalive(
    receivers: Vec<(String, Arc<dyn Transport>)>,
    held: Arc<Held>,
    interval: Duration,
) -> JoinHandle<()> {
    let task = async move {
        let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for ((name, transport), envelopes) in
                receivers.iter().zip(held.snapshot(receivers.len()))
            {
                if envelopes.is_empty() {
                    continue;
                }
                let span = tracing::debug_span!(
                    parent: None,
                    "keepalive",
                    otel.name = %format_args!("keepalive {name}"),
                    messaging.system = transport.messaging_system(),
                    messaging.destination.name = %name,
                    messaging.operation.name = "keepalive",
                    messaging.batch.message_count = envelopes.len(),
                );
                let call = transport.keepalive_batch(&envelopes).instrument(span);
                match tokio::time::timeout(interval, call).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(messaging.destination.name = %name, error = %crate::error_chain(&e), count = envelopes.len(), "keepalive failed");
                    }
                    Err(_) => {
                        tracing::warn!(messaging.destination.name = %name, count = envelopes.len(), "keepalive timed out");
                    }
                }
            }
        }
    };
    tokio::spawn(task)
}

/// Puts unstarted envelopes back on their transport at once, unchanged (shutdown, or a stop
/// mid-batch), on a task of its own; returns how many were put back.
pub(super) fn spawn_release(
    name: String,
    transport: Arc<dyn Transport>,
    held: Arc<Held>,
    envelopes: Vec<(u64, Envelope)>,
) -> JoinHandle<u64> {
    let span = settle_span("release", &name, &*transport, envelopes.len());
    let task = async move {
        let mut released = 0;
        for (key, envelope) in envelopes {
            match transport.retry(envelope, Duration::ZERO).await {
                Ok(()) => released += 1,
                Err(e) => {
                    tracing::warn!(messaging.destination.name = %name, error = %crate::error_chain(&e), "could not release a message; it will be redelivered");
                }
            }
            held.release_keys([key]);
        }
        released
    };
    tokio::spawn(task.instrument(span))
}

/// The `ack <transport>` / `release <transport>` span of one batch (`messaging.operation.type`
/// `settle`); a root span, as the batch mixes messages of many traces.
fn settle_span(
    operation: &'static str,
    name: &str,
    transport: &dyn Transport,
    count: usize,
) -> tracing::Span {
    tracing::debug_span!(
        parent: None,
        "settle",
        otel.name = %format_args!("{operation} {name}"),
        messaging.system = transport.messaging_system(),
        messaging.destination.name = %name,
        messaging.operation.type = "settle",
        messaging.operation.name = operation,
        messaging.batch.message_count = count,
    )
}
