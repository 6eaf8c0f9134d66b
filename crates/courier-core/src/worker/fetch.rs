//! The worker's fetch: one round over the receivers in priority order (the first batch wins),
//! on a task of its own while handlers run or polled by the loop itself, and what becomes of
//! what it brought.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::ack::{Acks, Carried, ForFetch};
use super::beside::Beside;
use super::io::AbortOnDrop;
use super::state::RunState;
use super::{Worker, WorkerEvent};
use crate::transport::{NO_ANSWER_AFTER, answered_within};
use crate::{Envelope, TransportError};

/// One fetch over the receivers in priority order.
pub(super) struct Fetched {
    /// The first receiver that had messages, and its batch.
    batch: Option<(usize, Vec<Envelope>)>,
    /// The receivers whose `get` failed on the way.
    errors: Vec<(usize, TransportError)>,
    /// Acks the fetch made first (see [`Worker::ack_then_fetch`]) that failed.
    ack_failed: u64,
    /// Acks that rode on the fetch ([`Transport::ack_and_get`](crate::Transport::ack_and_get))
    /// and failed with it: the ack flusher acks them again.
    unacked: Vec<(u64, Envelope)>,
}

impl Fetched {
    fn nothing() -> Self {
        Self {
            batch: None,
            errors: Vec::new(),
            ack_failed: 0,
            unacked: Vec::new(),
        }
    }
}

/// The next fetch: on a task of its own while handlers run (so it makes progress beside them),
/// polled by the loop itself when there is nothing else to do.
pub(super) enum Fetch {
    Task(AbortOnDrop<Fetched>),
    Inline(Pin<Box<dyn Future<Output = Fetched> + Send>>),
}

/// What the fetches of a worker are like, from what its receivers' transports can do.
#[derive(Debug, Clone, Copy)]
pub(super) struct FetchPlan {
    /// Every receiver's `get` blocks by itself: no sleep after an empty round.
    pub(super) all_block: bool,
    /// Every receiver's server pushes its deliveries ahead of any `get` (AMQP's prefetch): a
    /// fetch only takes what already arrived, with no round trip to overlap, so the loop polls
    /// it itself rather than hand it to a task and back (two thread wake-ups per batch).
    all_pushed: bool,
    /// The next fetch starts once no more than this many messages are queued.
    pub(super) low_water: usize,
}

impl FetchPlan {
    pub(super) fn new(worker: &Worker) -> Self {
        let caps = || worker.receivers.iter().map(|r| r.transport.capabilities());
        Self {
            all_block: caps().all(|c| c.blocking_get),
            all_pushed: caps().all(|c| c.bounded_unacked),
            low_water: (worker.options.fetch_size / 2).max(worker.options.concurrency),
        }
    }
}

impl Worker {
    /// How many messages the next fetch may ask for.
    pub(super) fn want(&self, state: &RunState, queued: usize) -> usize {
        let room = self.options.fetch_size;
        match self.options.limit {
            Some(limit) => {
                let left = limit.saturating_sub(state.stats.received + queued as u64);
                room.min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => room,
        }
    }

    /// Starts the next fetch of up to `want` messages; `idle`: no handler runs and nothing is
    /// queued, so there is nothing for a task to overlap with.
    pub(super) fn start_fetch(
        &self,
        plan: FetchPlan,
        acks: &mut Acks,
        beside: &mut Beside,
        want: usize,
        idle: bool,
        state: &RunState,
    ) -> Fetch {
        // While fetches fail (a broker restarting), the fetch goes on its task even where the
        // broker pushes: reconnecting is real I/O, not a local take, and runs beside the loop
        // like any other transport's fetch.
        let pushed = plan.all_pushed && state.error_backoff.failures() == 0;
        // Nothing to overlap with (or nothing but a local take): poll it here, no task and no
        // cross-thread wake-up (what one-at-a-time consumption pays per message).
        let inline = pushed || idle;
        let fetch = match acks.for_fetch(beside, inline) {
            ForFetch::AckFirst => Fetch::Inline(Box::pin(self.ack_then_fetch(beside, want))),
            ForFetch::Carried(carried) if inline => {
                Fetch::Inline(Box::pin(self.fetch(want, carried)))
            }
            ForFetch::Nothing if inline => Fetch::Inline(Box::pin(self.fetch(want, None))),
            ForFetch::Carried(carried) => {
                Fetch::Task(AbortOnDrop(tokio::spawn(self.fetch(want, carried))))
            }
            ForFetch::Nothing => Fetch::Task(AbortOnDrop(tokio::spawn(self.fetch(want, None)))),
        };
        acks.fetch_started(beside);
        fetch
    }

    /// One round over the receivers in priority order (the first batch wins), as a task;
    /// `carried` acks of the first receiver go in its round trip.
    fn fetch(
        &self,
        want: usize,
        carried: Carried,
    ) -> impl Future<Output = Fetched> + Send + 'static {
        let transports: Vec<_> = self
            .receivers
            .iter()
            .map(|r| (r.name.clone(), r.transport.clone()))
            .collect();
        async move {
            let mut fetched = Fetched::nothing();
            for (i, (name, transport)) in transports.iter().enumerate() {
                // A server that stopped answering on this connection is given up once the
                // get's own wait and a minute passed, and asked again (on another connection,
                // where the transport pools them).
                let bound = transport.capabilities().get_bound();
                let got = match (i, &carried) {
                    (0, Some((held, acks))) => {
                        let envelopes: Vec<Envelope> =
                            acks.iter().map(|(_, e)| e.clone()).collect();
                        let call = transport.ack_and_get(&envelopes, want);
                        let got = answered_within(bound, name, "acking and fetching", call).await;
                        if got.is_ok() {
                            held.release_keys(acks.iter().map(|(k, _)| *k));
                        }
                        got
                    }
                    _ => answered_within(bound, name, "fetching", transport.get(want)).await,
                };
                if got.is_err()
                    && i == 0
                    && let Some((_, acks)) = &carried
                {
                    fetched.unacked.clone_from(acks);
                }
                match got {
                    Ok(batch) if batch.is_empty() => {}
                    Ok(batch) => {
                        fetched.batch = Some((i, batch));
                        return fetched;
                    }
                    Err(e) => fetched.errors.push((i, e)),
                }
            }
            fetched
        }
    }

    /// Acks what each receiver has gathered, then fetches: for a broker that delivers the next
    /// message only once the last is acked, in one future the loop polls itself.
    fn ack_then_fetch(
        &self,
        beside: &mut Beside,
        want: usize,
    ) -> impl Future<Output = Fetched> + Send + 'static {
        let acks: Vec<_> = self
            .receivers
            .iter()
            .zip(beside.ackers.iter_mut())
            .map(|(r, acker)| (r.name.clone(), r.transport.clone(), acker.take()))
            .filter(|(_, _, pending)| !pending.is_empty())
            .collect();
        let held = beside.held.clone();
        let fetch = self.fetch(want, None);
        async move {
            let mut ack_failed = 0;
            for (name, transport, pending) in acks {
                let (keys, envelopes): (Vec<u64>, Vec<Envelope>) = pending.into_iter().unzip();
                let call = transport.ack_batch(&envelopes);
                if let Err(e) = answered_within(Some(NO_ANSWER_AFTER), &name, "acking", call).await
                {
                    tracing::warn!(messaging.destination.name = %name, error = %crate::error_chain(&e), count = envelopes.len(), "ack failed; the messages will be redelivered");
                    ack_failed += envelopes.len() as u64;
                }
                held.release_keys(keys);
            }
            let mut fetched = fetch.await;
            fetched.ack_failed = ack_failed;
            fetched
        }
    }

    /// Takes a fetch's result: holds and queues its batch (or releases it when stopping) and
    /// says how long to wait before the next fetch.
    pub(super) fn fetched(
        &self,
        beside: &mut Beside,
        fetched: Fetched,
        queue: &mut VecDeque<(usize, u64, Envelope)>,
        all_block: bool,
        state: &mut RunState,
    ) -> Option<Duration> {
        for (i, e) in &fetched.errors {
            let name = &self.receivers[*i].name;
            tracing::warn!(messaging.destination.name = %name, error = %crate::error_chain(e), "get failed");
            self.emit(&WorkerEvent::TransportError {
                transport: name.clone(),
                error: crate::error_chain(e).to_string(),
            });
        }
        state.stats.left_for_redelivery += fetched.ack_failed;
        if !fetched.unacked.is_empty() {
            // The fetch they rode on failed: the flusher acks them (again, if they went).
            for (key, envelope) in fetched.unacked {
                beside.ackers[0].push(key, envelope);
            }
            beside.ackers[0].flush();
        }
        let failed = !fetched.errors.is_empty();
        let error_wait = if failed {
            Some(state.error_backoff.failed())
        } else {
            state.error_backoff.succeeded();
            None
        };
        match fetched.batch {
            Some((r, batch)) => {
                let held: Vec<_> = batch
                    .into_iter()
                    .map(|envelope| (beside.held.hold(r, &envelope), envelope))
                    .collect();
                if state.stop.is_some() {
                    self.release(beside, held.into_iter().map(|(k, e)| (r, k, e)).collect());
                } else {
                    queue.extend(held.into_iter().map(|(k, e)| (r, k, e)));
                }
                error_wait
            }
            None if failed => error_wait,
            None => {
                self.emit_with(|| WorkerEvent::Idle);
                (!all_block).then_some(self.options.sleep)
            }
        }
    }
}

/// Waits for the fetch task (a fetch that panicked counts as an empty round); without one,
/// never resolves (the select's guard has ruled that branch out).
pub(super) async fn join_fetch(fetch: Option<&mut Fetch>) -> Fetched {
    let task = match fetch {
        None => return std::future::pending().await,
        Some(Fetch::Inline(fetch)) => return fetch.await,
        Some(Fetch::Task(task)) => &mut task.0,
    };
    match task.await {
        Ok(fetched) => fetched,
        Err(e) => {
            tracing::error!(error = %e, "the fetch task failed");
            Fetched::nothing()
        }
    }
}
