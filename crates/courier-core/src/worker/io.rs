//! The worker's I/O that runs beside the handlers, on tasks of its own: the ack flusher and the
//! keepalive of every message the worker holds.
//!
//! Neither ever waits on a handler, and no handler (nor the grace timer) ever waits on them: an
//! ack stalled on a dead server delays only the acks behind it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::{Listener, WorkerEvent};
use crate::{Envelope, Transport};

/// Every envelope the worker holds (fetched and not yet settled), started or not, by key.
///
/// The keepalive task keeps each of them alive, so a transport's redelivery window can be short:
/// a dead worker's messages come back within it, a live worker's slow ones do not.
#[derive(Debug, Default)]
pub(super) struct Held {
    entries: Mutex<HashMap<u64, (usize, Envelope)>>,
    next: AtomicU64,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (usize, Envelope)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds an envelope received from receiver `receiver`; returns its key.
    pub(super) fn hold(&self, receiver: usize, envelope: Envelope) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, (receiver, envelope));
        key
    }

    /// Lets go of envelopes (settled, or given up on).
    pub(super) fn release_keys(&self, keys: impl IntoIterator<Item = u64>) {
        let mut entries = self.lock();
        for key in keys {
            entries.remove(&key);
        }
    }

    /// Takes every envelope still held, with its receiver.
    pub(super) fn drain(&self) -> Vec<(usize, Envelope)> {
        self.lock().drain().map(|(_, held)| held).collect()
    }

    /// The held envelopes of each receiver.
    fn snapshot(&self, receivers: usize) -> Vec<Vec<Envelope>> {
        let mut out = vec![Vec::new(); receivers];
        for (receiver, envelope) in self.lock().values() {
            if let Some(list) = out.get_mut(*receiver) {
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

/// What the worker sends its ack flushers.
enum AckCommand {
    /// Ack this envelope in the next flush, then release `key` from [`Held`].
    Ack(u64, Envelope),
    /// Flush now: the worker has nothing else to handle at the moment.
    Flush,
}

/// The sending half of one receiver's ack flusher.
#[derive(Debug, Clone)]
pub(super) struct Acker {
    tx: mpsc::UnboundedSender<AckCommand>,
    /// Acks sent since the last flush request.
    waiting: usize,
}

impl Acker {
    /// Queues an envelope for the next `ack_batch`; `key` is released from [`Held`] once flushed.
    pub(super) fn ack(&mut self, key: u64, envelope: Envelope) {
        self.waiting += 1;
        // The flusher outlives the loop that sends to it; a closed channel cannot happen while
        // the worker runs, and would only mean redelivery.
        let _ = self.tx.send(AckCommand::Ack(key, envelope));
    }

    /// Flushes what is waiting without lingering (the batch is done).
    pub(super) fn flush(&mut self) {
        if self.waiting > 0 {
            self.waiting = 0;
            let _ = self.tx.send(AckCommand::Flush);
        }
    }
}

impl std::fmt::Debug for AckCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ack(key, _) => f.debug_tuple("Ack").field(key).finish(),
            Self::Flush => f.write_str("Flush"),
        }
    }
}

/// Starts the ack flusher of one receiver: it gathers acks for `linger` (or until `max_batch`
/// are waiting), flushes them with one `ack_batch`, and gathers the next ones meanwhile.
pub(super) fn spawn_acker(
    name: String,
    transport: Arc<dyn Transport>,
    held: Arc<Held>,
    listeners: Vec<Listener>,
    linger: Duration,
    max_batch: usize,
) -> (Acker, JoinHandle<AckStats>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<AckCommand>();
    let span = tracing::debug_span!("courier.ack", messaging.destination.name = %name);
    let task = async move {
        let mut stats = AckStats::default();
        let mut keys = Vec::new();
        let mut batch = Vec::new();
        while let Some(command) = rx.recv().await {
            let AckCommand::Ack(key, envelope) = command else {
                continue;
            };
            keys.push(key);
            batch.push(envelope);
            let deadline = Instant::now() + linger;
            while batch.len() < max_batch {
                // Take what is already waiting without a timer; wait out the linger only when
                // nothing is.
                let next = match rx.try_recv() {
                    Ok(command) => Some(command),
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                    Err(mpsc::error::TryRecvError::Empty) if linger.is_zero() => None,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        tokio::time::timeout_at(deadline, rx.recv())
                            .await
                            .ok()
                            .flatten()
                    }
                };
                match next {
                    Some(AckCommand::Ack(key, envelope)) => {
                        keys.push(key);
                        batch.push(envelope);
                    }
                    Some(AckCommand::Flush) | None => break,
                }
            }
            if let Err(e) = transport.ack_batch(&batch).await {
                tracing::warn!(error = %e, count = batch.len(), "ack failed; the messages will be redelivered");
                let event = WorkerEvent::TransportError {
                    transport: name.clone(),
                    error: e.to_string(),
                };
                for l in &listeners {
                    l(&event);
                }
                stats.failed += batch.len() as u64;
            }
            held.release_keys(keys.drain(..));
            batch.clear();
        }
        stats
    };
    (
        Acker { tx, waiting: 0 },
        tokio::spawn(task.instrument(span)),
    )
}

/// A task aborted when its handle is dropped: a worker whose `run` future is dropped (a task
/// aborted in-process) must not leave a keepalive behind that holds its messages forever.
#[derive(Debug)]
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

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
                match tokio::time::timeout(interval, transport.keepalive_batch(&envelopes)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(messaging.destination.name = %name, error = %e, count = envelopes.len(), "keepalive failed");
                    }
                    Err(_) => {
                        tracing::warn!(messaging.destination.name = %name, count = envelopes.len(), "keepalive timed out");
                    }
                }
            }
        }
    };
    tokio::spawn(task.instrument(tracing::debug_span!("courier.keepalive")))
}

/// Puts unstarted envelopes back on their transport at once, unchanged (shutdown, or a stop
/// mid-batch), on a task of its own; returns how many were put back.
pub(super) fn spawn_release(
    name: String,
    transport: Arc<dyn Transport>,
    held: Arc<Held>,
    envelopes: Vec<(u64, Envelope)>,
) -> JoinHandle<u64> {
    let task = async move {
        let mut released = 0;
        for (key, envelope) in envelopes {
            match transport.retry(envelope, Duration::ZERO).await {
                Ok(()) => released += 1,
                Err(e) => {
                    tracing::warn!(messaging.destination.name = %name, error = %e, "could not release a message; it will be redelivered");
                }
            }
            held.release_keys([key]);
        }
        released
    };
    tokio::spawn(task.instrument(tracing::debug_span!("courier.release")))
}
