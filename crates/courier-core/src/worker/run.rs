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
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ack::{Acks, Settled};
use super::beside::{Beside, SHUTDOWN_SLACK};
use super::fetch::{Fetch, FetchPlan, Fetched, join_fetch};
use super::process::Done;
use super::state::RunState;
use super::{StopReason, Worker, WorkerError, WorkerEvent, WorkerStats};
use crate::Envelope;

/// The wait after a failed `get`: 100 ms doubling up to 2 s. Short, since transports that
/// reconnect pace their own attempts (AMQP's `max_backoff`) and a longer wait here only adds
/// to theirs: a worker is back within 2 s of its transport.
const ERROR_BACKOFF: crate::Backoff =
    crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// A fetch that brought messages back within this found them waiting: a backlog, under which
/// small batches gather their acks. An idle worker's fetch waits for its message longer, and
/// its acks go at once (gathering would save nothing there, only hold the ack back).
const BACKLOG_FETCH: Duration = Duration::from_millis(1);

/// A message being handled: its receiver, its key in the held set, what became of it, and
/// whether it was in flight for a batch handler.
type Handling<'a> = Pin<Box<dyn Future<Output = (usize, u64, Done, bool)> + Send + 'a>>;

/// The loop's state between two turns.
struct Loop<'a> {
    /// Fetched messages not started yet: (receiver, key, envelope).
    queue: VecDeque<(usize, u64, Envelope)>,
    inflight: FuturesUnordered<Handling<'a>>,
    /// The next fetch: see [`Fetch`].
    fetching: Option<Fetch>,
    /// When the fetch under way started.
    fetch_started: Instant,
    /// Whether the last fetch found a backlog.
    backlog: bool,
    /// When the next fetch may start (after an idle round or a failed get).
    next_fetch: Option<Instant>,
    stopped_at: Option<Instant>,
    grace_at: Option<Instant>,
    /// Messages of batch handlers are in flight together, up to the largest batch per handler
    /// running at once; the others count against `concurrency`.
    batch_room: Option<usize>,
    /// Messages in flight for batch handlers.
    batched: usize,
    /// Stopping with batches being gathered: run them once every started message joined.
    flush_due: bool,
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

    /// Consumes until a stop; returns when it began. In-flight handlers are done (or abandoned
    /// past the grace period) when it returns.
    async fn run_loop(
        &self,
        shutdown: &CancellationToken,
        beside: &mut Beside,
        state: &mut RunState,
    ) -> Instant {
        let plan = FetchPlan::new(self);
        let mut acks = Acks::choose(self);
        let mut lp = self.new_loop();
        // Timers live across iterations: creating them per message would register and
        // deregister them with the runtime for every message.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        let fetch_timer = tokio::time::sleep_until(far);
        let grace_timer = tokio::time::sleep_until(far);
        let drain_timer = tokio::time::sleep_until(far);
        let linger_timer = tokio::time::sleep_until(far);
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
        loop {
            self.start_handlers(&mut lp, state);
            if state.stop.is_some() && lp.stopped_at.is_none() {
                drain_timer.as_mut().reset(self.stopping(&mut lp, beside));
            }
            if Self::fetch_due(&lp, plan, &acks, state) {
                let want = self.want(state, lp.queue.len());
                if want > 0 {
                    let idle = lp.inflight.is_empty() && lp.queue.is_empty();
                    lp.fetch_started = Instant::now();
                    let fetch = self.start_fetch(plan, &mut acks, beside, want, idle, state);
                    lp.fetching = Some(fetch);
                } else if lp.inflight.is_empty() && lp.queue.is_empty() {
                    state.stop = Some(StopReason::MessageLimit);
                    continue;
                }
            }
            if lp.inflight.is_empty() && (state.stop.is_some() && lp.fetching.is_none()) {
                break;
            }
            tokio::select! {
                biased;
                Some(handled) = lp.inflight.next() => {
                    if self.handled(&mut lp, &mut acks, beside, handled, state) {
                        linger_timer.as_mut().reset(Instant::now() + self.options.ack_linger);
                    }
                }
                // Reached only once every handler is pending: each started message has
                // joined its batch.
                () = std::future::ready(()), if lp.flush_due => {
                    lp.flush_due = false;
                    self.buses.values().chain(self.forced_bus.as_ref()).for_each(crate::MessageBus::flush_batches);
                }
                fetched = join_fetch(lp.fetching.as_mut()), if lp.fetching.is_some() => {
                    if let Some(at) = self.took_fetch(&mut lp, beside, plan, fetched, state) {
                        fetch_timer.as_mut().reset(at);
                    }
                }
                () = &mut linger_timer, if acks.lingering() => acks.flush_all(beside),
                () = &mut fetch_timer, if lp.next_fetch.is_some() => lp.next_fetch = None,
                () = &mut cancelled, if lp.grace_at.is_none() => {
                    state.stop.get_or_insert(StopReason::Shutdown);
                    let at = Instant::now() + self.options.grace;
                    lp.grace_at = Some(at);
                    grace_timer.as_mut().reset(at);
                }
                () = &mut grace_timer, if lp.grace_at.is_some() && !lp.inflight.is_empty() => {
                    tracing::warn!(abandoned = lp.inflight.len(), "grace period over: leaving in-flight messages for redelivery");
                    break;
                }
                () = &mut drain_timer, if lp.stopped_at.is_some() && lp.inflight.is_empty() => {
                    // The fetch under way did not come back in time; whatever it claims comes
                    // back after the redelivery window.
                    break;
                }
            }
        }
        let stopped_at = lp.stopped_at;
        drop(lp);
        acks.flush_all(beside);
        stopped_at.unwrap_or_else(Instant::now)
    }

    fn new_loop(&self) -> Loop<'_> {
        Loop {
            queue: VecDeque::new(),
            inflight: FuturesUnordered::new(),
            fetching: None,
            fetch_started: Instant::now(),
            backlog: false,
            next_fetch: None,
            stopped_at: None,
            grace_at: None,
            batch_room: self
                .buses
                .values()
                .chain(self.forced_bus.as_ref())
                .filter_map(crate::MessageBus::largest_batch)
                .max()
                .map(|size| size.saturating_mul(self.options.concurrency)),
            batched: 0,
            flush_due: false,
        }
    }

    /// Starts queued messages while there is room for them (none once stopping).
    fn start_handlers<'a>(&'a self, lp: &mut Loop<'a>, state: &mut RunState) {
        while state.stop.is_none() {
            let Some((_, _, front)) = lp.queue.front() else {
                break;
            };
            let for_batch = lp.batch_room.is_some()
                && self
                    .bus_for(front)
                    .batch_size(front.message_name())
                    .is_some();
            let room = if for_batch {
                lp.batch_room.is_some_and(|room| lp.batched < room)
            } else {
                lp.inflight.len() - lp.batched < self.options.concurrency
            };
            let Some((r, key, envelope)) = room.then(|| lp.queue.pop_front()).flatten() else {
                break;
            };
            lp.batched += usize::from(for_batch);
            state.stats.received += 1;
            let receiver = &self.receivers[r];
            lp.inflight.push(Box::pin(async move {
                (r, key, self.process(receiver, envelope).await, for_batch)
            }));
        }
    }

    /// The stop began: releases what is queued; returns how long a fetch under way may still
    /// take (it may bring a batch back: given a moment, what it brought is released rather
    /// than stranded).
    fn stopping(&self, lp: &mut Loop<'_>, beside: &mut Beside) -> Instant {
        let now = Instant::now();
        lp.stopped_at = Some(now);
        lp.flush_due = lp.batched > 0;
        self.release(beside, lp.queue.drain(..).collect());
        now + SHUTDOWN_SLACK
    }

    /// Whether the next fetch starts now: not stopping, none under way or waiting for its
    /// time, the queue low, and no handler running where the acks' route waits for them.
    fn fetch_due(lp: &Loop<'_>, plan: FetchPlan, acks: &Acks, state: &RunState) -> bool {
        state.stop.is_none()
            && lp.fetching.is_none()
            && lp.next_fetch.is_none()
            && lp.queue.len() <= plan.low_water
            && (!acks.fetch_waits_for_handlers() || lp.inflight.is_empty())
    }

    /// A handler finished: settles its message and hands acks over as the route says;
    /// returns whether the linger timer is to be started.
    fn handled(
        &self,
        lp: &mut Loop<'_>,
        acks: &mut Acks,
        beside: &mut Beside,
        (r, key, done, for_batch): (usize, u64, Done, bool),
        state: &mut RunState,
    ) -> bool {
        lp.batched -= usize::from(for_batch);
        lp.flush_due |= lp.stopped_at.is_some() && lp.batched > 0;
        let acked = self.settle(beside, r, key, done, state);
        let at = Settled {
            receiver: r,
            acked,
            batch_done: lp.queue.is_empty() && lp.inflight.is_empty(),
            fetching: lp.fetching.is_some(),
            fetch_next: lp.fetching.is_none() && lp.next_fetch.is_none() && state.stop.is_none(),
            backlog: lp.backlog,
        };
        let arm = acks.settled(beside, at);
        if state.stop.is_none() {
            state.stop = self.limit_reached(state);
        }
        arm
    }

    /// A fetch came back: queues its batch; returns when the next fetch may start, if it is
    /// to wait.
    fn took_fetch(
        &self,
        lp: &mut Loop<'_>,
        beside: &mut Beside,
        plan: FetchPlan,
        fetched: Fetched,
        state: &mut RunState,
    ) -> Option<Instant> {
        lp.fetching = None;
        let queued = lp.queue.len();
        let delay = self.fetched(beside, fetched, &mut lp.queue, plan.all_block, state);
        lp.backlog = lp.queue.len() > queued && lp.fetch_started.elapsed() <= BACKLOG_FETCH;
        let at = delay.map(|delay| Instant::now() + delay);
        if at.is_some() {
            lp.next_fetch = at;
        }
        if state.stop.is_none() {
            state.stop = self.limit_reached(state);
        }
        at
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
}
