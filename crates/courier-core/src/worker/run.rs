//! The worker loop.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Receiver, StopReason, Worker, WorkerError, WorkerEvent, WorkerStats};
use crate::retry::{RetryDecision, decide};
use crate::{
    BusError, BusNameStamp, Envelope, ErrorDetailsStamp, RedeliveryStamp,
    SentToFailureTransportStamp, TraceContextStamp, retry_count, with_trace_context,
};

/// What became of one message.
enum Outcome {
    /// Handled: ack it.
    Ack(Envelope),
    /// Moved to the failure transport: ack it.
    Moved(Envelope),
    /// Put back by `Transport::retry` (which acked the old delivery itself).
    Retried,
    /// Not acked: it will be delivered again.
    Left,
}

struct Done {
    outcome: Outcome,
    failed: bool,
}

const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(30);

impl Worker {
    /// Runs until a limit is reached or `shutdown` is cancelled; then lets in-flight handlers
    /// finish within the grace period and flushes their acks.
    ///
    /// # Errors
    /// [`WorkerError`] when the worker cannot start (no receivers). Once running, transport and
    /// handler errors are reported as events and never stop the worker.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerStats, WorkerError> {
        if self.receivers.is_empty() {
            return Err(WorkerError::NoReceivers);
        }
        let mut state = RunState {
            stats: WorkerStats::default(),
            started: Instant::now(),
            error_backoff: Duration::ZERO,
            stop: None,
        };
        self.emit(&WorkerEvent::Started {
            transports: self.receivers.iter().map(|r| r.name.clone()).collect(),
        });
        let all_block = self
            .receivers
            .iter()
            .all(|r| r.transport.capabilities().blocking_get);
        'outer: while state.stop.is_none() {
            if shutdown.is_cancelled() {
                state.stop = Some(StopReason::Shutdown);
                break;
            }
            let mut got_any = false;
            for receiver in &self.receivers {
                let want = match self.options.limit {
                    Some(limit) => usize::try_from(limit.saturating_sub(state.stats.received))
                        .unwrap_or(usize::MAX),
                    None => usize::MAX,
                }
                .min(self.options.fetch_size);
                if want == 0 {
                    state.stop = Some(StopReason::MessageLimit);
                    break 'outer;
                }
                let fetched = tokio::select! {
                    r = receiver.transport.get(want) => r,
                    () = shutdown.cancelled() => {
                        state.stop = Some(StopReason::Shutdown);
                        break 'outer;
                    }
                };
                match fetched {
                    Ok(batch) if batch.is_empty() => {
                        state.error_backoff = Duration::ZERO;
                    }
                    Ok(batch) => {
                        state.error_backoff = Duration::ZERO;
                        got_any = true;
                        self.process_batch(receiver, batch, &shutdown, &mut state)
                            .await;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(messaging.destination.name = %receiver.name, error = %e, "get failed");
                        self.emit(&WorkerEvent::TransportError {
                            transport: receiver.name.clone(),
                            error: e.to_string(),
                        });
                        state.error_backoff = (state.error_backoff * 2)
                            .clamp(Duration::from_millis(100), MAX_ERROR_BACKOFF);
                        tokio::select! {
                            () = tokio::time::sleep(state.error_backoff) => {}
                            () = shutdown.cancelled() => {}
                        }
                    }
                }
            }
            if state.stop.is_none() {
                state.stop = self.limit_reached(&state);
            }
            if !got_any && state.stop.is_none() {
                self.emit_with(|| WorkerEvent::Idle);
                if !all_block {
                    tokio::select! {
                        () = tokio::time::sleep(self.options.sleep) => {}
                        () = shutdown.cancelled() => {}
                    }
                }
            }
        }
        state.stats.stop_reason = state.stop;
        let reason = state.stop.unwrap_or(StopReason::Shutdown);
        tracing::info!(reason = ?reason, handled = state.stats.handled, failed = state.stats.failed, "worker stopped");
        self.emit(&WorkerEvent::Stopped { reason });
        Ok(state.stats)
    }

    fn emit(&self, event: &WorkerEvent) {
        for l in &self.listeners {
            l(event);
        }
    }

    /// Emits an event built only when someone listens (events allocate; the hot path must not).
    fn emit_with(&self, event: impl FnOnce() -> WorkerEvent) {
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

    async fn process_batch(
        &self,
        receiver: &Receiver,
        batch: Vec<Envelope>,
        shutdown: &CancellationToken,
        state: &mut RunState,
    ) {
        type Task<'a> = Pin<Box<dyn Future<Output = (usize, Done)> + Send + 'a>>;
        let mut queue: VecDeque<(usize, Envelope)> = batch.into_iter().enumerate().collect();
        let mut inflight: FuturesUnordered<Task<'_>> = FuturesUnordered::new();
        let mut live: Vec<Option<Envelope>> = vec![None; queue.len()];
        let mut pending_acks: Vec<Envelope> = Vec::new();
        let mut linger: Option<Instant> = None;
        let mut grace: Option<Instant> = None;
        // Timers and the shutdown wait live across iterations: creating them per message would
        // register and deregister them with the runtime for every message.
        let far = Duration::from_secs(86_400 * 365);
        let linger_timer = tokio::time::sleep(far);
        let grace_timer = tokio::time::sleep(far);
        let cancelled = shutdown.cancelled();
        tokio::pin!(linger_timer, grace_timer, cancelled);
        let mut keepalive = self
            .options
            .keepalive
            .map(|i| tokio::time::interval_at(Instant::now() + i, i));
        // In-flight envelopes are kept only for whoever needs them: keepalive and listeners.
        let track = self.options.keepalive.is_some() || !self.listeners.is_empty();
        loop {
            while state.stop.is_none() && inflight.len() < self.options.concurrency {
                let Some((idx, envelope)) = queue.pop_front() else {
                    break;
                };
                state.stats.received += 1;
                if track {
                    live[idx] = Some(envelope.clone());
                }
                inflight.push(Box::pin(async move {
                    (idx, self.process(receiver, envelope).await)
                }));
            }
            if inflight.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                Some((idx, done)) = inflight.next() => {
                    live[idx] = None;
                    if done.failed {
                        state.stats.failed += 1;
                    }
                    match done.outcome {
                        Outcome::Ack(envelope) => {
                            state.stats.handled += 1;
                            pending_acks.push(envelope);
                        }
                        Outcome::Moved(envelope) => {
                            state.stats.moved_to_failure += 1;
                            pending_acks.push(envelope);
                        }
                        Outcome::Retried => state.stats.retried += 1,
                        Outcome::Left => state.stats.left_for_redelivery += 1,
                    }
                    if linger.is_none() && !pending_acks.is_empty() {
                        let at = Instant::now() + self.options.ack_linger;
                        linger = Some(at);
                        linger_timer.as_mut().reset(at);
                    }
                    if state.stop.is_none() {
                        state.stop = self.limit_reached(state);
                    }
                }
                () = &mut linger_timer, if linger.is_some() => {
                    self.flush_acks(receiver, &mut pending_acks, state).await;
                    linger = None;
                }
                () = &mut cancelled, if grace.is_none() => {
                    state.stop.get_or_insert(StopReason::Shutdown);
                    let at = Instant::now() + self.options.grace;
                    grace = Some(at);
                    grace_timer.as_mut().reset(at);
                }
                () = &mut grace_timer, if grace.is_some() => {
                    let abandoned = inflight.len() as u64;
                    tracing::warn!(abandoned, "grace period over: leaving in-flight messages for redelivery");
                    state.stats.left_for_redelivery += abandoned;
                    for envelope in live.iter().flatten() {
                        self.emit_with(|| WorkerEvent::LeftForRedelivery {
                            transport: receiver.name.clone(),
                            id: envelope.id().map(str::to_owned),
                            reason: "grace period over".into(),
                        });
                    }
                    break;
                }
                _ = async { match keepalive.as_mut() { Some(k) => k.tick().await, None => std::future::pending().await } } => {
                    for envelope in live.iter().flatten() {
                        if let Err(e) = receiver.transport.keepalive(envelope).await {
                            tracing::warn!(messaging.destination.name = %receiver.name, error = %e, "keepalive failed");
                        }
                    }
                }
            }
        }
        drop(inflight);
        self.flush_acks(receiver, &mut pending_acks, state).await;
        if !queue.is_empty() {
            // Stopping mid-batch: put the unprocessed messages back at once, unchanged.
            for (_, envelope) in queue {
                if let Err(e) = receiver.transport.retry(envelope, Duration::ZERO).await {
                    tracing::warn!(messaging.destination.name = %receiver.name, error = %e, "could not release a message; it will be redelivered");
                }
            }
        }
    }

    async fn flush_acks(
        &self,
        receiver: &Receiver,
        pending: &mut Vec<Envelope>,
        state: &mut RunState,
    ) {
        if pending.is_empty() {
            return;
        }
        let batch = std::mem::take(pending);
        if let Err(e) = receiver.transport.ack_batch(&batch).await {
            tracing::warn!(messaging.destination.name = %receiver.name, error = %e, count = batch.len(), "ack failed; the messages will be redelivered");
            self.emit(&WorkerEvent::TransportError {
                transport: receiver.name.clone(),
                error: e.to_string(),
            });
            state.stats.left_for_redelivery += batch.len() as u64;
        }
    }

    async fn process(&self, receiver: &Receiver, envelope: Envelope) -> Done {
        let id = envelope.id().map(str::to_owned);
        let span = tracing::info_span!(
            "courier.handle",
            messaging.system = "courier",
            messaging.destination.name = %receiver.name,
            messaging.message.id = id.as_deref().unwrap_or(""),
            messaging.message.type = envelope.message_name(),
        );
        self.process_inner(receiver, envelope.with_shared(&receiver.received), id)
            .instrument(span)
            .await
    }

    async fn process_inner(
        &self,
        receiver: &Receiver,
        envelope: Envelope,
        id: Option<String>,
    ) -> Done {
        self.emit_with(|| WorkerEvent::Received {
            transport: receiver.name.clone(),
            message: envelope.message_name().to_owned(),
            id: id.clone(),
        });
        if let Some(error) = envelope.decode_error() {
            let details = ErrorDetailsStamp::from_error("decode", error);
            tracing::warn!(error = %error, "message does not decode");
            self.emit_with(|| WorkerEvent::Failed {
                transport: receiver.name.clone(),
                message: envelope.message_name().to_owned(),
                id: id.clone(),
                error: error.to_string(),
                will_retry: false,
            });
            let outcome = self
                .move_to_failure(receiver, envelope.clone(), envelope, details, id)
                .await;
            return Done {
                outcome,
                failed: true,
            };
        }
        let bus = envelope
            .last::<BusNameStamp>()
            .and_then(|b| self.buses.get(&b.0))
            .unwrap_or(&self.default_bus);
        let trace = envelope.last::<TraceContextStamp>().cloned();
        let started = Instant::now();
        let err = match with_trace_context(trace, bus.dispatch(envelope.clone())).await {
            Ok(_) => {
                self.emit_with(|| WorkerEvent::Handled {
                    transport: receiver.name.clone(),
                    message: envelope.message_name().to_owned(),
                    id,
                    elapsed: started.elapsed(),
                });
                return Done {
                    outcome: Outcome::Ack(envelope),
                    failed: false,
                };
            }
            Err(e) => e,
        };
        let decision = decide(&*receiver.retry, &envelope, &err);
        let will_retry = matches!(decision, RetryDecision::Retry(_));
        tracing::warn!(error = %err, will_retry, "handling failed");
        self.emit_with(|| WorkerEvent::Failed {
            transport: receiver.name.clone(),
            message: envelope.message_name().to_owned(),
            id: id.clone(),
            error: err.to_string(),
            will_retry,
        });
        let details = ErrorDetailsStamp::from_error(err.class(), &err);
        let after = match err {
            BusError::HandlerFailed {
                envelope: handled, ..
            } => *handled,
            _ => envelope.clone(),
        };
        let outcome = match decision {
            RetryDecision::Retry(delay) => {
                let count = retry_count(&envelope) + 1;
                let next = after
                    .with_error_details(details)
                    .with(RedeliveryStamp::new(count));
                match receiver.transport.retry(next, delay).await {
                    Ok(()) => {
                        self.emit_with(|| WorkerEvent::Retried {
                            transport: receiver.name.clone(),
                            id,
                            retry_count: count,
                            delay,
                        });
                        Outcome::Retried
                    }
                    Err(e) => self.left(receiver, id, format!("retry failed: {e}")),
                }
            }
            RetryDecision::Reject => {
                self.move_to_failure(receiver, envelope, after, details, id)
                    .await
            }
        };
        Done {
            outcome,
            failed: true,
        }
    }

    async fn move_to_failure(
        &self,
        receiver: &Receiver,
        original: Envelope,
        after: Envelope,
        details: ErrorDetailsStamp,
        id: Option<String>,
    ) -> Outcome {
        let Some((failure_name, failure)) = &receiver.failure else {
            return self.left(
                receiver,
                id,
                "failed and no failure transport is configured".into(),
            );
        };
        let moved = after
            .with_error_details(details)
            .with(SentToFailureTransportStamp::new(receiver.name.clone()))
            .without_all::<crate::DelayStamp>();
        match failure.send(moved).await {
            Ok(_) => {
                self.emit_with(|| WorkerEvent::MovedToFailureTransport {
                    transport: receiver.name.clone(),
                    failure_transport: failure_name.clone(),
                    id,
                });
                Outcome::Moved(original)
            }
            Err(e) => self.left(
                receiver,
                id,
                format!("could not move to failure transport `{failure_name}`: {e}"),
            ),
        }
    }

    fn left(&self, receiver: &Receiver, id: Option<String>, reason: String) -> Outcome {
        tracing::warn!(messaging.destination.name = %receiver.name, reason = %reason, "message left for redelivery");
        self.emit_with(|| WorkerEvent::LeftForRedelivery {
            transport: receiver.name.clone(),
            id,
            reason,
        });
        Outcome::Left
    }
}

struct RunState {
    stats: WorkerStats,
    started: Instant,
    error_backoff: Duration,
    stop: Option<StopReason>,
}

/// Resident set size in bytes (Linux `/proc/self/statm`), if known.
fn resident_memory() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
