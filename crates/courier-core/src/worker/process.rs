//! What the worker does with one message: dispatch it, then ack, retry or move it.

use tokio::time::Instant;
use tracing::Instrument;

use super::{Receiver, Worker, WorkerEvent};
use crate::metrics;
use crate::retry::{RetryDecision, decide};
use crate::{
    BusError, BusNameStamp, Envelope, ErrorDetailsStamp, RedeliveryStamp,
    SentToFailureTransportStamp, TraceContextStamp, retry_count, with_trace_context,
};

/// What became of one message.
pub(super) enum Outcome {
    /// Handled: ack it.
    Ack(Envelope),
    /// Moved to the failure transport: ack it.
    Moved(Envelope),
    /// Put back by `Transport::retry` (which acked the old delivery itself).
    Retried,
    /// Not acked: it will be delivered again.
    Left,
    /// A hook skipped it and it was rejected (or acked: then it is [`Outcome::Ack`]).
    Skipped,
}

pub(super) struct Done {
    pub(super) outcome: Outcome,
    pub(super) failed: bool,
    /// A hook or the handler asked the worker to stop after this message.
    pub(super) stop: bool,
    /// A hook skipped the message.
    pub(super) skipped: bool,
}

impl Done {
    fn new(outcome: Outcome, failed: bool) -> Self {
        Self {
            outcome,
            failed,
            stop: false,
            skipped: false,
        }
    }
}

impl Worker {
    /// The bus a message is dispatched on: the forced one, the one its `BusNameStamp` names,
    /// or the default.
    pub(super) fn bus_for(&self, envelope: &Envelope) -> &crate::MessageBus {
        self.forced_bus.as_ref().unwrap_or_else(|| {
            envelope
                .last::<BusNameStamp>()
                .and_then(|b| self.buses.get(&b.0))
                .unwrap_or(&self.default_bus)
        })
    }

    pub(super) async fn process(&self, receiver: &Receiver, envelope: Envelope) -> Done {
        let id = envelope.id().map(str::to_owned);
        let span = crate::trace::process_span(
            &receiver.name,
            receiver.transport.messaging_system(),
            id.as_deref().unwrap_or(""),
            &envelope,
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
        let message_type = metrics::message_type(&envelope);
        metrics::message(metrics::MESSAGES_RECEIVED, &receiver.label, &message_type);
        self.emit_with(|| WorkerEvent::Received {
            transport: receiver.name.clone(),
            message: envelope.message_name().to_owned(),
            id: id.clone(),
        });
        if let Some(error) = envelope.decode_error() {
            let details = ErrorDetailsStamp::from_error("decode", error);
            tracing::warn!(error = %error, "message does not decode");
            metrics::message(metrics::MESSAGES_FAILED, &receiver.label, &message_type);
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
            if matches!(outcome, Outcome::Moved(_)) {
                metrics::message(
                    metrics::MESSAGES_MOVED_TO_FAILURE,
                    &receiver.label,
                    &message_type,
                );
            }
            return Done::new(outcome, true);
        }
        let (envelope, stop) = match self.run_hooks(receiver, envelope, &id).await {
            Ok(received) => received,
            Err(skipped) => return skipped,
        };
        let mut done = self.handle(receiver, envelope, id, message_type).await;
        done.stop |= stop;
        done
    }

    /// Runs the [`Received`](super::Received) hooks: the envelope to handle and whether to stop
    /// after it, or what became of a skipped message.
    async fn run_hooks(
        &self,
        receiver: &Receiver,
        envelope: Envelope,
        id: &Option<String>,
    ) -> Result<(Envelope, bool), Done> {
        if self.on_received.is_empty() {
            return Ok((envelope, false));
        }
        let mut received = super::Received::new(&receiver.name, envelope);
        for hook in &self.on_received {
            hook(&mut received);
        }
        let (envelope, skip, stop) = received.into_parts();
        let Some(how) = skip else {
            return Ok((envelope, stop));
        };
        self.emit_with(|| WorkerEvent::Skipped {
            transport: receiver.name.clone(),
            message: envelope.message_name().to_owned(),
            id: id.clone(),
            how,
        });
        let outcome = match how {
            super::Skip::Reject => match receiver.transport.reject(&envelope).await {
                Ok(()) => Outcome::Skipped,
                Err(e) => self.left(receiver, id.clone(), format!("reject failed: {e}")),
            },
            _ => Outcome::Ack(envelope),
        };
        Err(Done {
            outcome,
            failed: false,
            stop,
            skipped: true,
        })
    }

    /// Dispatches on the bus, then acks, retries or moves the message.
    async fn handle(
        &self,
        receiver: &Receiver,
        envelope: Envelope,
        id: Option<String>,
        message_type: crate::metrics::SharedString,
    ) -> Done {
        let bus = self.bus_for(&envelope);
        let trace = envelope.last::<TraceContextStamp>().cloned();
        let started = Instant::now();
        let dispatch = with_trace_context(trace, bus.dispatch(envelope.clone()));
        let result = match receiver.handler_timeout {
            None => dispatch.await,
            Some(after) => tokio::time::timeout(after, dispatch)
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::Timeout {
                        name: envelope.message_name().to_owned(),
                        timeout: crate::HandlerTimeout::new(after),
                    })
                }),
        };
        metrics::handler_duration(&receiver.label, &message_type, started.elapsed());
        let err = match result {
            Ok(_) => {
                metrics::message(metrics::MESSAGES_HANDLED, &receiver.label, &message_type);
                self.emit_with(|| WorkerEvent::Handled {
                    transport: receiver.name.clone(),
                    message: envelope.message_name().to_owned(),
                    id,
                    elapsed: started.elapsed(),
                });
                return Done::new(Outcome::Ack(envelope), false);
            }
            Err(e) => e,
        };
        let stop = err
            .handler_failures()
            .iter()
            .any(|f| f.error.stops_worker());
        let decision = decide(&*receiver.retry, &envelope, &err);
        let will_retry = matches!(decision, RetryDecision::Retry(_));
        self.report_failure(
            receiver,
            &envelope,
            &err,
            will_retry,
            id.as_deref(),
            &message_type,
        );
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
                self.retry_later(receiver, next, count, delay, id, &message_type)
                    .await
            }
            RetryDecision::Reject => {
                let outcome = self
                    .move_to_failure(receiver, envelope, after, details, id)
                    .await;
                if matches!(outcome, Outcome::Moved(_)) {
                    metrics::message(
                        metrics::MESSAGES_MOVED_TO_FAILURE,
                        &receiver.label,
                        &message_type,
                    );
                }
                outcome
            }
        };
        Done {
            outcome,
            failed: true,
            stop,
            skipped: false,
        }
    }

    /// Counts, logs and reports (as [`WorkerEvent::Failed`]) a failed handling.
    fn report_failure(
        &self,
        receiver: &Receiver,
        envelope: &Envelope,
        err: &BusError,
        will_retry: bool,
        id: Option<&str>,
        message_type: &crate::metrics::SharedString,
    ) {
        metrics::message(metrics::MESSAGES_FAILED, &receiver.label, message_type);
        if timed_out(err) {
            // The handler (or the whole dispatch) was dropped: say so apart from other failures.
            tracing::warn!(error = %err, will_retry, class = "timeout", "handler timed out: its future was dropped");
            metrics::message(metrics::HANDLER_TIMEOUTS, &receiver.label, message_type);
        } else {
            tracing::warn!(error = %err, will_retry, "handling failed");
        }
        self.emit_with(|| WorkerEvent::Failed {
            transport: receiver.name.clone(),
            message: envelope.message_name().to_owned(),
            id: id.map(str::to_owned),
            error: err.to_string(),
            will_retry,
        });
    }

    /// Puts a failed message (`next`: with its error details and retry count `count`) back on
    /// its transport for another delivery after `delay`.
    async fn retry_later(
        &self,
        receiver: &Receiver,
        next: Envelope,
        count: u32,
        delay: std::time::Duration,
        id: Option<String>,
        message_type: &crate::metrics::SharedString,
    ) -> Outcome {
        match receiver.transport.retry(next, delay).await {
            Ok(()) => {
                metrics::message(metrics::MESSAGES_RETRIED, &receiver.label, message_type);
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

/// Whether the failure is a timeout: the transport's handler timeout, or a handler's own.
fn timed_out(err: &BusError) -> bool {
    matches!(err, BusError::Timeout { .. })
        || err
            .handler_failures()
            .iter()
            .any(|f| matches!(f.error.classifying(), crate::HandlerError::Timeout(_)))
}
