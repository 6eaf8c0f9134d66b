//! Where the acks of settled messages go: one route, chosen when the loop starts from what the
//! receivers' transports can do, and what it does when a message is settled, when a fetch
//! starts and when the linger runs out.
//!
//! Acks of one fetched batch are gathered and handed to the receiver's ack flusher together
//! ([`Acker`]); the route decides when, and whether some ride on a fetch instead.

use std::sync::Arc;

use super::beside::Beside;
use super::io::{Acker, Held};
use super::process::{Done, Outcome};
use super::state::RunState;
use super::{StopReason, Worker};
use crate::Envelope;

/// How many acks may gather across small batches while the next fetch is under way (up to
/// the linger) before they are flushed: at a fetch size of 1, one ack statement per this many
/// messages instead of one each.
const MIN_ACK_GATHER: usize = 16;

/// Acks of the first receiver handed to the next fetch, to go in its round trip.
pub(super) type Carried = Option<(Arc<Held>, Vec<(u64, Envelope)>)>;

/// The route of a worker's acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AckRoute {
    /// The broker's window is no larger than what runs at once (AMQP prefetch not above the
    /// concurrency): a fetch started beside the handlers could receive nothing before their
    /// acks, so the next fetch starts once they are done, and acks first, in the same future.
    BeforeNextFetch,
    /// The first receiver acks and claims in one round trip
    /// ([`Capabilities::ack_with_get`](crate::Capabilities::ack_with_get), SQL: one
    /// transaction, one commit): its acks wait for the next fetch and ride on it (or go after
    /// the linger); the other receivers' are flushed at each batch's end.
    OnGet,
    /// Acks are handed to the flushers: at each batch's end (small batches' acks gather while
    /// the next fetch is under way, under a backlog), or under a broker's window in chunks.
    Flushed,
}

/// What the route hands the next fetch.
pub(super) enum ForFetch {
    /// Nothing: the acks go their own way.
    Nothing,
    /// The first receiver's acks, to go in the fetch's round trip.
    Carried(Carried),
    /// Every receiver's gathered acks go first, then the fetch ([`AckRoute::BeforeNextFetch`]).
    AckFirst,
}

/// Where the loop stands when a message is settled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settled {
    /// The receiver whose message it was.
    pub(super) receiver: usize,
    /// Whether its ack started a new batch of acks.
    pub(super) acked: bool,
    /// Nothing is queued nor in flight: the batch is done.
    pub(super) batch_done: bool,
    /// A fetch is under way.
    pub(super) fetching: bool,
    /// No fetch is under way, none is waiting for its time, and the worker is not stopping:
    /// the next fetch starts now.
    pub(super) fetch_next: bool,
    /// The last fetch found a backlog.
    pub(super) backlog: bool,
}

/// The acks' route and its state (see the [module docs](self)).
#[derive(Debug)]
pub(super) struct Acks {
    route: AckRoute,
    /// A broker bounds the unacked deliveries (AMQP prefetch) and sends the next ones only
    /// once the finished ones are acked, with no window to chunk by: every receiver's acks are
    /// handed over as each fetch starts. Elsewhere acks wait for the batch's end (one
    /// statement per batch, not two).
    flush_before_fetch: bool,
    /// Under a broker's window, acks go out in chunks of half of it (see
    /// [`Capabilities::unacked_window`](crate::Capabilities::unacked_window)): not at each
    /// fetch nor at each batch's end, where a small batch would be answered by a small one.
    chunk: Option<usize>,
    /// The most acks a receiver gathers before they are flushed.
    max: usize,
    /// The linger timer runs for acks gathered and not handed over.
    lingering: bool,
}

impl Acks {
    /// Chooses the route for `worker`'s receivers and options.
    pub(super) fn choose(worker: &Worker) -> Self {
        let fetch_size = worker.options.fetch_size;
        let bounded = worker
            .receivers
            .iter()
            .any(|r| r.transport.capabilities().bounded_unacked);
        let route = if bounded && fetch_size <= worker.options.concurrency {
            AckRoute::BeforeNextFetch
        } else if worker
            .receivers
            .first()
            .is_some_and(|r| r.transport.capabilities().ack_with_get)
        {
            AckRoute::OnGet
        } else {
            AckRoute::Flushed
        };
        let chunk = if route == AckRoute::BeforeNextFetch {
            None
        } else {
            worker
                .receivers
                .iter()
                .filter_map(|r| r.transport.capabilities().unacked_window)
                .min()
                .map(|window| (window.min(fetch_size) / 2).max(1))
        };
        // A batch's acks are handed over once it is full; riding on fetches, the acks of the
        // last half of one batch and the first half of the next go together.
        let max = match chunk {
            Some(chunk) => chunk,
            None if route == AckRoute::OnGet => fetch_size.max(1) * 2,
            None => fetch_size.max(MIN_ACK_GATHER),
        };
        Self {
            route,
            flush_before_fetch: bounded && chunk.is_none(),
            chunk,
            max,
            lingering: false,
        }
    }

    /// Whether the next fetch waits until no handler runs ([`AckRoute::BeforeNextFetch`]).
    pub(super) fn fetch_waits_for_handlers(&self) -> bool {
        self.route == AckRoute::BeforeNextFetch
    }

    /// Whether the linger timer runs.
    pub(super) fn lingering(&self) -> bool {
        self.lingering
    }

    /// What goes with the fetch about to start (`inline`: polled by the loop itself).
    pub(super) fn for_fetch(&mut self, beside: &mut Beside, inline: bool) -> ForFetch {
        match self.route {
            AckRoute::BeforeNextFetch if inline => {
                self.lingering = false;
                ForFetch::AckFirst
            }
            AckRoute::BeforeNextFetch | AckRoute::Flushed => ForFetch::Nothing,
            AckRoute::OnGet => {
                let acks = beside.ackers[0].take();
                if beside.ackers.iter().all(|a| a.pending() == 0) {
                    self.lingering = false;
                }
                if acks.is_empty() {
                    ForFetch::Nothing
                } else {
                    ForFetch::Carried(Some((beside.held.clone(), acks)))
                }
            }
        }
    }

    /// A fetch started.
    pub(super) fn fetch_started(&mut self, beside: &mut Beside) {
        if self.flush_before_fetch {
            self.flush_all(beside);
        }
    }

    /// A message was settled (its ack, if any, gathered): hands acks over as the route says.
    /// Returns whether the linger timer is to be started.
    pub(super) fn settled(&mut self, beside: &mut Beside, at: Settled) -> bool {
        // Under a broker's window no wider than the handlers, the fetch that starts as the
        // last handler ends takes its acks at once: a linger armed for them would only wake the
        // timer driver, once a message (a reset to a later deadline leaves the earlier wheel
        // entry to fire), on the path between a delivery and its ack.
        let fetch_next = self.route == AckRoute::BeforeNextFetch && at.batch_done && at.fetch_next;
        let arm = at.acked && !self.lingering && !fetch_next;
        if arm {
            self.lingering = true;
        }
        let pending = |beside: &Beside| beside.ackers[at.receiver].pending();
        match self.route {
            // The next fetch acks them (or the linger, or the stop, flushes them).
            AckRoute::BeforeNextFetch => {}
            AckRoute::OnGet if at.batch_done => {
                // The batch is done: the first receiver's acks go with the next fetch, which
                // starts now unless one is under way (then the linger flushes them if it does
                // not come back first).
                beside.ackers.iter_mut().skip(1).for_each(Acker::flush);
                if at.fetching && beside.ackers[0].pending() == 0 {
                    self.lingering = false;
                }
            }
            _ if at.batch_done
                && self.chunk.is_none()
                && (!at.fetching || !at.backlog || pending(beside) >= self.max) =>
            {
                // The batch is done and nothing else is under way: flush its acks now rather
                // than after the linger. While the next fetch is, under a backlog, small
                // batches' acks gather (up to `max` or the linger): one ack statement for
                // several fetches, not one each.
                self.flush_all(beside);
            }
            _ if pending(beside) >= self.max => beside.ackers[at.receiver].flush(),
            _ => {}
        }
        arm
    }

    /// Hands every gathered ack to the flushers (the linger ran out, or the loop ends).
    pub(super) fn flush_all(&mut self, beside: &mut Beside) {
        beside.ackers.iter_mut().for_each(Acker::flush);
        self.lingering = false;
    }
}

impl Worker {
    /// Records what became of a message and adds its ack to the receiver's batch; returns
    /// whether the ack started a new batch.
    pub(super) fn settle(
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
}
