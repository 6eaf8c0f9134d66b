//! The worker loop: handlers in front, I/O beside them.
//!
//! One task polls the in-flight handlers, the next fetch, the shutdown signal and the grace
//! timer together, and awaits nothing else: acks are flushed by a task per receiver, every held
//! message is kept alive by a keepalive task, and unstarted messages are released on tasks of
//! their own. So a server that stalls delays only the I/O that waits on it; handlers (and the
//! run heartbeats inside them), keepalives and the grace timer go on. A call that a server
//! leaves unanswered altogether (a connection black-holed by a failover or a NAT) is given up
//! a minute past its own wait ([`NO_ANSWER_AFTER`],
//! [`Capabilities::get_bound`](crate::Capabilities::get_bound)), so the worker is not stuck
//! until TCP gives up on the connection (about 15 minutes).
//!
//! The next batch is fetched while the current one is handled, at most one batch ahead: a fetch
//! of `fetch_size` starts once half of the current batch has started. A worker therefore holds
//! at most `1.5 x fetch_size + concurrency` messages, every one of them kept alive, and a dead
//! worker's messages come back within the transport's redelivery window.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::io::{self, AbortOnDrop, AckStats, Acker, Held};
use super::process::{Done, Outcome};
use super::{StopReason, Worker, WorkerError, WorkerEvent, WorkerStats};
use crate::transport::{NO_ANSWER_AFTER, answered_within};
use crate::{Envelope, TransportError};

/// The wait after a failed `get`: 100 ms doubling up to 2 s. Short, since transports that
/// reconnect pace their own attempts (AMQP's `max_backoff`) and a longer wait here only adds
/// to theirs: a worker is back within 2 s of its transport.
const ERROR_BACKOFF: crate::Backoff =
    crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// How long a stopping worker may take past its grace period to flush acks and release
/// unstarted messages, whatever the servers do.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(1);

/// How many acks may gather across small batches while the next fetch is under way (up to
/// the linger) before they are flushed: at a fetch size of 1, one ack statement per this many
/// messages instead of one each.
const MIN_ACK_GATHER: usize = 16;

/// A fetch that brought messages back within this found them waiting: a backlog, under which
/// small batches gather their acks. An idle worker's fetch waits for its message longer, and
/// its acks go at once (gathering would save nothing there, only hold the ack back).
const BACKLOG_FETCH: Duration = Duration::from_millis(1);

/// The shortest keepalive interval derived from a transport's redelivery window.
const MIN_KEEPALIVE: Duration = Duration::from_millis(50);

/// One fetch over the receivers in priority order.
struct Fetched {
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

/// Acks of the first receiver handed to the next fetch, to go in its round trip.
type Carried = Option<(Arc<Held>, Vec<(u64, Envelope)>)>;

/// A message being handled: its receiver, its key in [`Held`], what became of it, and whether
/// it was in flight for a batch handler.
type Handling<'a> = Pin<Box<dyn Future<Output = (usize, u64, Done, bool)> + Send + 'a>>;

/// The next fetch: on a task of its own while handlers run (so it makes progress beside them),
/// polled by the loop itself when there is nothing else to do.
enum Fetch {
    Task(AbortOnDrop<Fetched>),
    Inline(Pin<Box<dyn Future<Output = Fetched> + Send>>),
}

/// The tasks beside the loop.
struct Beside {
    held: Arc<Held>,
    ackers: Vec<Acker>,
    ack_tasks: Vec<JoinHandle<AckStats>>,
    keepalive: Option<AbortOnDrop<()>>,
    /// Bumps the heartbeat metric every second, beside the loop (not under
    /// [`crate::testing::run_until_empty`]).
    heartbeat: Option<AbortOnDrop<()>>,
    releases: Vec<JoinHandle<u64>>,
}

impl Worker {
    /// Runs until a limit is reached or `shutdown` is cancelled; then lets in-flight handlers
    /// finish within the grace period, releases unstarted messages and flushes the acks, taking
    /// at most a second past the grace period whatever the servers do.
    ///
    /// # Errors
    /// [`WorkerError`] when the worker cannot start (no receivers). Once running, transport and
    /// handler errors are reported as events and never stop the worker.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerStats, WorkerError> {
        if self.receivers.is_empty() {
            return Err(WorkerError::NoReceivers);
        }
        // A stop requested through the registry stops the loop like `shutdown`.
        let shutdown = shutdown.child_token();
        let beating = self.registration.clone().map(|r| r.start(shutdown.clone()));
        let mut beside = self.start_beside();
        let mut state = RunState {
            stats: WorkerStats::default(),
            started: Instant::now(),
            error_backoff: ERROR_BACKOFF.attempts(),
            stop: None,
        };
        self.emit(&WorkerEvent::Started {
            transports: self.receivers.iter().map(|r| r.name.clone()).collect(),
        });
        let stopped_at = self.run_loop(&shutdown, &mut beside, &mut state).await;
        self.finish(beside, stopped_at, &mut state).await;
        if let Some(beating) = beating {
            beating.finish().await;
        }
        state.stats.stop_reason = state.stop;
        let reason = state.stop.unwrap_or(StopReason::Shutdown);
        tracing::info!(reason = ?reason, handled = state.stats.handled, failed = state.stats.failed, "worker stopped");
        self.emit(&WorkerEvent::Stopped { reason });
        Ok(state.stats)
    }

    fn start_beside(&self) -> Beside {
        let keepalive = self.keepalive_interval();
        // Envelopes are kept for the keepalive, and for listeners (what is left is named);
        // otherwise the set only counts.
        let held = Arc::new(Held::new(keepalive.is_some() || !self.listeners.is_empty()));
        let max_batch = self.options.fetch_size.saturating_mul(2).max(1);
        let (ackers, ack_tasks) = self
            .receivers
            .iter()
            .map(|r| {
                io::spawn_acker(
                    r.name.clone(),
                    r.transport.clone(),
                    held.clone(),
                    self.listeners.clone(),
                    max_batch,
                )
            })
            .unzip();
        let keepalive = keepalive.map(|interval| {
            let receivers = self
                .receivers
                .iter()
                .map(|r| (r.name.clone(), r.transport.clone()))
                .collect();
            AbortOnDrop(io::spawn_keepalive(receivers, held.clone(), interval))
        });
        Beside {
            held,
            ackers,
            ack_tasks,
            keepalive,
            heartbeat: self
                .options
                .heartbeat_metric
                .then(|| AbortOnDrop(crate::metrics::spawn_heartbeat())),
            releases: Vec::new(),
        }
    }

    /// The keepalive interval: the one configured, else a third of the shortest redelivery
    /// window among the receivers (none when no receiver has one).
    pub(super) fn keepalive_interval(&self) -> Option<Duration> {
        self.options.keepalive.or_else(|| {
            self.receivers
                .iter()
                .filter_map(|r| r.transport.capabilities().redeliver_after)
                .min()
                .map(|window| (window / 3).max(MIN_KEEPALIVE))
        })
    }

    /// Consumes until a stop; returns when it began. In-flight handlers are done (or abandoned
    /// past the grace period) when it returns.
    async fn run_loop(
        &self,
        shutdown: &CancellationToken,
        beside: &mut Beside,
        state: &mut RunState,
    ) -> Instant {
        let all_block = self
            .receivers
            .iter()
            .all(|r| r.transport.capabilities().blocking_get);
        let concurrency = self.options.concurrency;
        let ack_before_fetch = self
            .receivers
            .iter()
            .any(|r| r.transport.capabilities().bounded_unacked);
        // A server that bounds the unacked deliveries pushes them ahead of any `get` (AMQP's
        // prefetch): a fetch only takes what already arrived, with no round trip to overlap, so
        // the loop polls it itself rather than hand it to a task and back (two thread wake-ups
        // per batch, what made a RabbitMQ worker slower than the raw lapin loop).
        let all_pushed = self
            .receivers
            .iter()
            .all(|r| r.transport.capabilities().bounded_unacked);
        let low_water = (self.options.fetch_size / 2).max(concurrency);
        // Where the broker's window is no larger than what runs at once, a fetch started beside
        // the handlers could receive nothing before their acks: fetch once they are done, and
        // ack in the same future (one task hand-off a message fewer).
        let fetch_when_done = ack_before_fetch && self.options.fetch_size <= concurrency;
        // Where the first receiver acks and claims in one round trip (SQL: one transaction, one
        // commit), its acks wait for the next fetch and ride on it (or go after the linger).
        let ack_with_get = !fetch_when_done
            && self
                .receivers
                .first()
                .is_some_and(|r| r.transport.capabilities().ack_with_get);
        // A batch's acks are handed over once it is full; riding on fetches, the acks of the
        // last half of one batch and the first half of the next go together.
        // Under a broker's window, acks go out in chunks of half of it (see
        // [`Capabilities::unacked_window`](crate::Capabilities::unacked_window)): not at each
        // fetch nor at each batch's end, where a small batch would be answered by a small one.
        let ack_chunk = if fetch_when_done {
            None
        } else {
            self.receivers
                .iter()
                .filter_map(|r| r.transport.capabilities().unacked_window)
                .min()
                .map(|window| (window.min(self.options.fetch_size) / 2).max(1))
        };
        let max_acks = match ack_chunk {
            Some(chunk) => chunk,
            None if ack_with_get => self.options.fetch_size.max(1) * 2,
            None => self.options.fetch_size.max(MIN_ACK_GATHER),
        };
        let mut queue: VecDeque<(usize, u64, Envelope)> = VecDeque::new();
        let mut inflight: FuturesUnordered<Handling<'_>> = FuturesUnordered::new();
        // The next fetch: see [`Fetch`].
        let mut fetching: Option<Fetch> = None;
        // When the fetch under way started, and whether the last one found a backlog.
        let mut fetch_started = Instant::now();
        let mut backlog = false;
        // When the next fetch may start (after an idle round or a failed get).
        let mut next_fetch: Option<Instant> = None;
        let mut stopped_at: Option<Instant> = None;
        let mut grace_at: Option<Instant> = None;
        // Timers live across iterations: creating them per message would register and
        // deregister them with the runtime for every message.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        let fetch_timer = tokio::time::sleep_until(far);
        let grace_timer = tokio::time::sleep_until(far);
        let drain_timer = tokio::time::sleep_until(far);
        let linger_timer = tokio::time::sleep_until(far);
        let mut lingering = false;
        let cancelled = shutdown.cancelled();
        tokio::pin!(
            fetch_timer,
            grace_timer,
            drain_timer,
            linger_timer,
            cancelled
        );
        if shutdown.is_cancelled() {
            state.stop = Some(StopReason::Shutdown);
        }
        // Messages of batch handlers are in flight together, up to the largest batch per
        // handler running at once; the others count against `concurrency`.
        let batch_room = self
            .buses
            .values()
            .chain(self.forced_bus.as_ref())
            .filter_map(crate::MessageBus::largest_batch)
            .max()
            .map(|size| size.saturating_mul(concurrency));
        let mut batched = 0_usize;
        // Stopping with batches being gathered: run them once every started message joined.
        let mut flush_due = false;
        loop {
            while state.stop.is_none() {
                let Some((_, _, front)) = queue.front() else {
                    break;
                };
                let for_batch = batch_room.is_some()
                    && self
                        .bus_for(front)
                        .batch_size(front.message_name())
                        .is_some();
                let room = if for_batch {
                    batch_room.is_some_and(|room| batched < room)
                } else {
                    inflight.len() - batched < concurrency
                };
                let Some((r, key, envelope)) = room.then(|| queue.pop_front()).flatten() else {
                    break;
                };
                batched += usize::from(for_batch);
                state.stats.received += 1;
                let receiver = &self.receivers[r];
                inflight.push(Box::pin(async move {
                    (r, key, self.process(receiver, envelope).await, for_batch)
                }));
            }
            if state.stop.is_some() && stopped_at.is_none() {
                let now = Instant::now();
                stopped_at = Some(now);
                flush_due = batched > 0;
                // A fetch under way may still bring a batch back: give it a moment, then
                // release what it brought rather than strand it.
                drain_timer.as_mut().reset(now + SHUTDOWN_SLACK);
                self.release(beside, queue.drain(..).collect());
            }
            if state.stop.is_none()
                && fetching.is_none()
                && next_fetch.is_none()
                && queue.len() <= low_water
                && (!fetch_when_done || inflight.is_empty())
            {
                let want = self.want(state, queue.len());
                if want > 0 {
                    let carried = if ack_with_get {
                        let acks = beside.ackers[0].take();
                        if beside.ackers.iter().all(|a| a.pending() == 0) {
                            lingering = false;
                        }
                        (!acks.is_empty()).then(|| (beside.held.clone(), acks))
                    } else {
                        None
                    };
                    // While fetches fail (a broker restarting), the fetch goes on its task
                    // even where the broker pushes: reconnecting is real I/O, not a local take,
                    // and runs beside the loop like any other transport's fetch.
                    let pushed = all_pushed && state.error_backoff.failures() == 0;
                    fetch_started = Instant::now();
                    fetching = Some(if pushed || (inflight.is_empty() && queue.is_empty()) {
                        // Nothing to overlap with (or nothing but a local take: `all_pushed`):
                        // poll it here, no task and no cross-thread wake-up (what one-at-a-time
                        // consumption pays per message).
                        if fetch_when_done {
                            lingering = false;
                            Fetch::Inline(Box::pin(self.ack_then_fetch(beside, want)))
                        } else {
                            Fetch::Inline(Box::pin(self.fetch(want, carried)))
                        }
                    } else {
                        Fetch::Task(AbortOnDrop(tokio::spawn(self.fetch(want, carried))))
                    });
                    if ack_before_fetch && ack_chunk.is_none() {
                        // A broker that bounds the unacked deliveries (AMQP prefetch) sends the
                        // next ones only once the finished ones are acked. Elsewhere acks wait
                        // for the batch's end: one statement per batch, not two.
                        beside.ackers.iter_mut().for_each(Acker::flush);
                        lingering = false;
                    }
                } else if inflight.is_empty() && queue.is_empty() {
                    state.stop = Some(StopReason::MessageLimit);
                    continue;
                }
            }
            if inflight.is_empty() && (state.stop.is_some() && fetching.is_none()) {
                break;
            }
            tokio::select! {
                biased;
                Some((r, key, done, for_batch)) = inflight.next() => {
                    batched -= usize::from(for_batch);
                    flush_due |= stopped_at.is_some() && batched > 0;
                    let acked = self.settle(beside, r, key, done, state);
                    // Under a broker's window no wider than the handlers, the fetch that starts
                    // as the last handler ends takes its acks at once: a linger armed for them
                    // would only wake the timer driver, once a message (a reset to a later
                    // deadline leaves the earlier wheel entry to fire), on the path between a
                    // delivery and its ack.
                    let fetch_next = fetch_when_done
                        && inflight.is_empty()
                        && queue.is_empty()
                        && fetching.is_none()
                        && next_fetch.is_none()
                        && state.stop.is_none();
                    if acked && !lingering && !fetch_next {
                        lingering = true;
                        linger_timer.as_mut().reset(Instant::now() + self.options.ack_linger);
                    }
                    if fetch_when_done {
                        // The next fetch acks them (or the linger, or the stop, flushes them).
                    } else if ack_with_get && queue.is_empty() && inflight.is_empty() {
                        // The batch is done: the first receiver's acks go with the next fetch,
                        // which starts now unless one is under way (then the linger flushes
                        // them if it does not come back first).
                        beside.ackers.iter_mut().skip(1).for_each(Acker::flush);
                        if fetching.is_some() && beside.ackers[0].pending() == 0 {
                            lingering = false;
                        }
                    } else if queue.is_empty()
                        && inflight.is_empty()
                        && ack_chunk.is_none()
                        && (fetching.is_none()
                            || !backlog
                            || beside.ackers[r].pending() >= max_acks)
                    {
                        // The batch is done and nothing else is under way: flush its acks now
                        // rather than after the linger. While the next fetch is, under a backlog
                        // (see `BACKLOG_FETCH`), small batches' acks gather (up to `max_acks` or
                        // the linger): one ack statement for several fetches, not one each.
                        beside.ackers.iter_mut().for_each(Acker::flush);
                        lingering = false;
                    } else if beside.ackers[r].pending() >= max_acks {
                        beside.ackers[r].flush();
                    }
                    if state.stop.is_none() {
                        state.stop = self.limit_reached(state);
                    }
                }
                // Reached only once every handler is pending: each started message has
                // joined its batch.
                () = std::future::ready(()), if flush_due => {
                    flush_due = false;
                    self.buses.values().chain(self.forced_bus.as_ref()).for_each(crate::MessageBus::flush_batches);
                }
                fetched = join_fetch(fetching.as_mut()), if fetching.is_some() => {
                    fetching = None;
                    let queued = queue.len();
                    let delay = self.fetched(beside, fetched, &mut queue, all_block, state);
                    backlog = queue.len() > queued && fetch_started.elapsed() <= BACKLOG_FETCH;
                    if let Some(delay) = delay {
                        let at = Instant::now() + delay;
                        next_fetch = Some(at);
                        fetch_timer.as_mut().reset(at);
                    }
                    if state.stop.is_none() {
                        state.stop = self.limit_reached(state);
                    }
                }
                () = &mut linger_timer, if lingering => {
                    beside.ackers.iter_mut().for_each(Acker::flush);
                    lingering = false;
                }
                () = &mut fetch_timer, if next_fetch.is_some() => {
                    next_fetch = None;
                }
                () = &mut cancelled, if grace_at.is_none() => {
                    state.stop.get_or_insert(StopReason::Shutdown);
                    let at = Instant::now() + self.options.grace;
                    grace_at = Some(at);
                    grace_timer.as_mut().reset(at);
                }
                () = &mut grace_timer, if grace_at.is_some() && !inflight.is_empty() => {
                    tracing::warn!(abandoned = inflight.len(), "grace period over: leaving in-flight messages for redelivery");
                    break;
                }
                () = &mut drain_timer, if stopped_at.is_some() && inflight.is_empty() => {
                    // The fetch under way did not come back in time; whatever it claims comes
                    // back after the redelivery window.
                    break;
                }
            }
        }
        drop(fetching);
        drop(inflight);
        beside.ackers.iter_mut().for_each(Acker::flush);
        stopped_at.unwrap_or_else(Instant::now)
    }

    /// How many messages the next fetch may ask for.
    fn want(&self, state: &RunState, queued: usize) -> usize {
        let room = self.options.fetch_size;
        match self.options.limit {
            Some(limit) => {
                let left = limit.saturating_sub(state.stats.received + queued as u64);
                room.min(usize::try_from(left).unwrap_or(usize::MAX))
            }
            None => room,
        }
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
            let mut errors = Vec::new();
            let mut unacked = Vec::new();
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
                    unacked.clone_from(acks);
                }
                match got {
                    Ok(batch) if batch.is_empty() => {}
                    Ok(batch) => {
                        return Fetched {
                            batch: Some((i, batch)),
                            errors,
                            ack_failed: 0,
                            unacked,
                        };
                    }
                    Err(e) => errors.push((i, e)),
                }
            }
            Fetched {
                batch: None,
                errors,
                ack_failed: 0,
                unacked,
            }
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
    fn fetched(
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

    /// Records what became of a message and adds its ack to the receiver's batch; returns
    /// whether the ack started a new batch.
    fn settle(
        &self,
        beside: &mut Beside,
        r: usize,
        key: u64,
        done: Done,
        state: &mut RunState,
    ) -> bool {
        if done.failed {
            state.stats.failed += 1;
        }
        if done.stop {
            state.stop.get_or_insert(StopReason::StopRequested);
        }
        if done.skipped {
            state.stats.skipped += 1;
        }
        if let Some(r) = &self.registration {
            r.counts.settled(
                matches!(done.outcome, Outcome::Ack(_)) && !done.skipped,
                done.failed,
            );
        }
        match done.outcome {
            Outcome::Ack(envelope) => {
                if !done.skipped {
                    state.stats.handled += 1;
                }
                beside.ackers[r].push(key, envelope)
            }
            Outcome::Skipped => {
                beside.held.release_keys([key]);
                false
            }
            Outcome::Moved(envelope) => {
                state.stats.moved_to_failure += 1;
                beside.ackers[r].push(key, envelope)
            }
            Outcome::Retried => {
                state.stats.retried += 1;
                beside.held.release_keys([key]);
                false
            }
            Outcome::Left => {
                state.stats.left_for_redelivery += 1;
                beside.held.release_keys([key]);
                false
            }
        }
    }

    /// Puts unstarted messages back on their transports, on tasks beside the loop.
    fn release(&self, beside: &mut Beside, messages: Vec<(usize, u64, Envelope)>) {
        let mut by_receiver: Vec<Vec<(u64, Envelope)>> = vec![Vec::new(); self.receivers.len()];
        for (r, key, envelope) in messages {
            by_receiver[r].push((key, envelope));
        }
        for (receiver, messages) in self.receivers.iter().zip(by_receiver) {
            if messages.is_empty() {
                continue;
            }
            beside.releases.push(io::spawn_release(
                receiver.name.clone(),
                receiver.transport.clone(),
                beside.held.clone(),
                messages,
            ));
        }
    }

    /// Flushes the last acks and waits for the releases, until the grace period has passed
    /// since the stop and one second more; what is still held then is left for redelivery.
    async fn finish(&self, beside: Beside, stopped_at: Instant, state: &mut RunState) {
        let Beside {
            held,
            ackers,
            ack_tasks,
            keepalive,
            heartbeat,
            releases,
        } = beside;
        drop(heartbeat);
        drop(ackers);
        let deadline = (stopped_at + self.options.grace).max(Instant::now()) + SHUTDOWN_SLACK;
        for task in ack_tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(stats)) => state.stats.left_for_redelivery += stats.failed,
                Ok(Err(_)) => {}
                Err(_) => {
                    abort.abort();
                    tracing::warn!(
                        "ack flush did not finish in time; the messages will be redelivered"
                    );
                }
            }
        }
        for task in releases {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(released)) => state.stats.released += released,
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        drop(keepalive);
        let left = held.drain();
        if !left.is_empty() {
            tracing::warn!(
                count = left.len(),
                "stopping with unsettled messages; they will be redelivered"
            );
        }
        state.stats.left_for_redelivery += left.len() as u64;
        for (r, envelope) in left {
            self.emit_with(|| WorkerEvent::LeftForRedelivery {
                transport: self.receivers[r].name.clone(),
                id: envelope.as_ref().and_then(Envelope::id).map(str::to_owned),
                reason: "not settled when the worker stopped".into(),
            });
        }
    }

    pub(super) fn emit(&self, event: &WorkerEvent) {
        for l in &self.listeners {
            l(event);
        }
    }

    /// Emits an event built only when someone listens (events allocate; the hot path must not).
    pub(super) fn emit_with(&self, event: impl FnOnce() -> WorkerEvent) {
        if !self.listeners.is_empty() {
            self.emit(&event());
        }
    }

    fn limit_reached(&self, state: &RunState) -> Option<StopReason> {
        let o = &self.options;
        if o.limit.is_some_and(|l| state.stats.received >= l) {
            return Some(StopReason::MessageLimit);
        }
        if o.failure_limit.is_some_and(|l| state.stats.failed >= l) {
            return Some(StopReason::FailureLimit);
        }
        if o.time_limit.is_some_and(|t| state.started.elapsed() >= t) {
            return Some(StopReason::TimeLimit);
        }
        if o.memory_limit
            .is_some_and(|m| resident_memory().is_some_and(|rss| rss > m))
        {
            return Some(StopReason::MemoryLimit);
        }
        None
    }
}

/// Waits for the fetch task (a fetch that panicked counts as an empty round); without one,
/// never resolves (the select's guard has ruled that branch out).
async fn join_fetch(fetch: Option<&mut Fetch>) -> Fetched {
    let task = match fetch {
        None => return std::future::pending().await,
        Some(Fetch::Inline(fetch)) => return fetch.await,
        Some(Fetch::Task(task)) => &mut task.0,
    };
    match task.await {
        Ok(fetched) => fetched,
        Err(e) => {
            tracing::error!(error = %e, "the fetch task failed");
            Fetched {
                batch: None,
                errors: Vec::new(),
                ack_failed: 0,
                unacked: Vec::new(),
            }
        }
    }
}

struct RunState {
    stats: WorkerStats,
    started: Instant,
    error_backoff: crate::Attempts,
    stop: Option<StopReason>,
}

/// Resident set size in bytes, if known: Linux's `VmRSS` line of `/proc/self/status`, in kB
/// whatever the page size (`/proc/self/statm` counts pages, 4 KiB on x86-64 but 16 or 64 KiB
/// on some arm64 kernels).
fn resident_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    vm_rss(&status)
}

/// The `VmRSS:   1234 kB` line of a `/proc/PID/status` text, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let unit = match parts.next()? {
        "kB" => 1024,
        "mB" | "MB" => 1024 * 1024,
        "B" => 1,
        _ => return None,
    };
    value.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_in_bytes_from_vm_rss() {
        let status = "Name:\tcourier\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(vm_rss(status), Some(12345 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None);
        assert_eq!(vm_rss("VmRSS:\t  oops kB\n"), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn resident_memory_is_the_size_of_a_running_test_process() {
        // A test binary's threads and heap hold megabytes; read as pages of an assumed 4 KiB on
        // a 64 KiB-page kernel it would be a sixteenth of that.
        let rss = resident_memory().unwrap_or(0);
        assert!(
            (2 << 20..64 << 30).contains(&rss),
            "a test process holds 2 MiB to 64 GiB: {rss} B"
        );
    }
}
