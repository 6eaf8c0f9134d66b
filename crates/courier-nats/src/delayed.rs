//! Delayed messages wait on the delay subject for a durable consumer of their own, so however
//! many wait, they never fill the pending window (`max_ack_pending`) of the consumer workers
//! pull from, and never hold up a message sent without a delay.
//!
//! A [`Promoter`] task per transport, started by its first `get`, pulls the delay consumer with
//! a waiting pull: a message not due yet goes back with `-NAK {"delay": what is left}` (the
//! server offers it again when it is due, to whichever promoter is pulling), a due one is
//! published on the subject workers pull from (`Nats-Msg-Id: courier-delayed:<its sequence>`,
//! so a promotion repeated after a crash within the duplicate window is stored once), and
//! acked once its PubAck came: at least once, never lost. The delay consumer holds at most
//! `max_delayed` messages at once; past that, further delayed messages wait unread in the
//! stream until held ones are promoted (late, never early).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::message::PublishMessage;
use courier_core::{Backoff, TransportError, TransportErrorKind};
use futures_util::{FutureExt, StreamExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::errors::{nats_error, publish_kind, request_kind};
use crate::link::{Link, Session};
use crate::wire::{self, AckSubject};

/// Messages one pull of the delay consumer asks for.
const PULL: usize = 512;

/// How long one waiting pull of the delay consumer lasts.
const PULL_WAIT: Duration = Duration::from_secs(5);

/// How long past its expiry a waiting pull may take to end before the promoter stops waiting.
const WAIT_SLACK: Duration = Duration::from_secs(1);

/// The first wait after a failed round; it doubles up to `max_backoff`.
const RETRY_BASE: Duration = Duration::from_millis(100);

/// How long a due message whose promotion failed waits before it is offered again.
const RETRY_PROMOTION: Duration = Duration::from_secs(1);

/// Nanoseconds since the epoch by this process's clock.
pub(crate) fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// What is left of a delayed message's delay: its due time is the server's store time (in the
/// ack subject) plus the delay, read against this process's clock. `None` when it is due.
pub(crate) fn left(ack: AckSubject, delay: Option<Duration>, now: u128) -> Option<Duration> {
    let due = ack.published_nanos.saturating_add(delay?.as_nanos());
    (due > now).then(|| Duration::from_nanos(u64::try_from(due - now).unwrap_or(u64::MAX)))
}

/// The `-NAK` that gives a delivery back to be offered again after `delay`.
pub(crate) fn nak_after(delay: Duration) -> String {
    format!(
        "-NAK {{\"delay\":{}}}",
        u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX)
    )
}

/// The promoter task of one transport.
#[derive(Debug, Default)]
pub(crate) struct Promoter {
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Promoter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the task unless it runs (again, if its runtime went away).
    pub(crate) fn ensure(&self, link: &Arc<Link>) {
        let mut task = self.lock();
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *task = Some(tokio::spawn(run(Arc::clone(link))));
    }

    /// Stops the task; what it held comes back to another promoter after `ack_wait`.
    pub(crate) fn stop(&self) {
        if let Some(task) = self.lock().take() {
            task.abort();
        }
    }
}

impl Drop for Promoter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pulls the delay consumer until aborted; a failed round is retried after a backoff.
async fn run(link: Arc<Link>) {
    let mut failures = 0u32;
    loop {
        match round(&link).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = failures.saturating_add(1);
                let wait = Backoff::new(RETRY_BASE, link.options.max_backoff)
                    .delay(failures.saturating_sub(1));
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(messaging.destination.name = %link.name(), failures, ?wait, error = %e, "nats delayed messages: pulling the delay consumer failed; retrying");
                } else {
                    tracing::debug!(messaging.destination.name = %link.name(), failures, ?wait, error = %e, "nats delayed messages: pulling the delay consumer failed; retrying");
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// One waiting pull of the delay consumer: each message handled as it comes, with what else
/// has already arrived.
async fn round(link: &Link) -> Result<(), TransportError> {
    let (session, consumer) = link.delayed().await?;
    let disconnects = link.disconnects();
    let mut batch = consumer
        .batch()
        .max_messages(PULL)
        .expires(PULL_WAIT)
        .messages()
        .await
        .map_err(|e| {
            use async_nats::jetstream::consumer::pull::BatchErrorKind as K;
            let kind = match e.kind() {
                K::Subscribe | K::Pull | K::Flush => TransportErrorKind::Connection,
                K::Serialize => TransportErrorKind::Protocol,
            };
            nats_error(link.name(), kind, "pull of delayed messages failed", e)
        })?;
    let deadline = Instant::now() + PULL_WAIT + WAIT_SLACK;
    loop {
        let next = tokio::time::timeout_at(deadline, batch.next());
        let Some(next) = Link::unless_disconnected(disconnects.clone(), next).await else {
            return Err(link.disconnected("a pull of delayed messages"));
        };
        let first = match next {
            Ok(Some(Ok(message))) => message,
            Ok(None) | Err(_) => return Ok(()),
            Ok(Some(Err(e))) => {
                // The consumer may have been deleted: look it up (or set it up) again.
                link.invalidate().await;
                return Err(TransportError::new(
                    TransportErrorKind::Connection,
                    link.name().to_owned(),
                )
                .with_context("pull of delayed messages failed")
                .with_source(e));
            }
        };
        let mut got = vec![first];
        while got.len() < PULL {
            match batch.next().now_or_never() {
                Some(Some(Ok(message))) => got.push(message),
                _ => break,
            }
        }
        promote(link, &session, got).await?;
    }
}

/// Gives back what is not due (`-NAK` with what is left), publishes what is due on the subject
/// workers pull from and acks each once its PubAck came.
async fn promote(
    link: &Link,
    session: &Session,
    messages: Vec<async_nats::jetstream::Message>,
) -> Result<(), TransportError> {
    let now = now_nanos();
    let mut due = Vec::with_capacity(messages.len());
    for message in messages {
        let message = message.message;
        let Some(reply) = message.reply.as_ref().map(|r| r.as_str().to_owned()) else {
            continue;
        };
        let Some(ack) = AckSubject::parse(&reply) else {
            tracing::warn!(messaging.destination.name = %link.name(), reply = %reply, "nats delayed message with an unknown ack subject left for redelivery");
            continue;
        };
        let (_, delay) = wire::incoming(message.headers.as_ref());
        match left(ack, delay, now) {
            Some(left) => {
                if let Err(e) = session.client.publish(reply, nak_after(left).into()).await {
                    tracing::warn!(messaging.destination.name = %link.name(), error = %e, "nats delayed message not given back; it returns after ack_wait");
                }
            }
            None => due.push((reply, ack, message)),
        }
    }
    if due.is_empty() {
        return Ok(());
    }
    let disconnects = link.disconnects();
    let mut pending = Vec::with_capacity(due.len());
    for (_, ack, message) in &due {
        let headers = wire::forwarded(
            message.headers.as_ref(),
            None,
            format!("courier-delayed:{}", ack.stream_seq),
        );
        let publish = PublishMessage::build()
            .payload(message.payload.clone())
            .headers(headers);
        let sent = session
            .jetstream
            .send_publish(link.options.subject.clone(), publish)
            .await;
        pending.push(sent);
    }
    let confirms = futures_util::future::join_all(pending.into_iter().map(|sent| async move {
        match sent {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        }
    }));
    let Some(confirmed) = Link::unless_disconnected(disconnects.clone(), confirms).await else {
        return Err(link.disconnected("the promotion of due delayed messages"));
    };
    let mut acks = Vec::with_capacity(due.len());
    for ((reply, _, _), result) in due.into_iter().zip(confirmed) {
        match result {
            Ok(_) => acks.push(async move {
                session
                    .client
                    .request(reply, "+ACK".into())
                    .await
                    .map_err(|e| {
                        nats_error(
                            link.name(),
                            request_kind(&e.kind()),
                            "`+ACK` of a promoted delayed message failed (it is promoted again, \
                             deduplicated within the duplicate window)",
                            e,
                        )
                    })
            }),
            Err(e) => {
                let e = nats_error(
                    link.name(),
                    publish_kind(&e.kind()),
                    format!(
                        "promoting a due delayed message to `{}` failed; offered again in {RETRY_PROMOTION:?}",
                        link.options.subject
                    ),
                    e,
                );
                tracing::warn!(messaging.destination.name = %link.name(), error = %e, "nats delayed message not promoted");
                let _ = session
                    .client
                    .publish(reply, nak_after(RETRY_PROMOTION).into())
                    .await;
            }
        }
    }
    let acked = futures_util::future::join_all(acks);
    let Some(acked) = Link::unless_disconnected(disconnects, acked).await else {
        return Err(link.disconnected("the acks of promoted delayed messages"));
    };
    for result in acked {
        if let Err(e) = result {
            tracing::warn!(messaging.destination.name = %link.name(), error = %e, "nats promoted delayed message not acked");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(published_nanos: u128) -> AckSubject {
        AckSubject {
            stream_seq: 1,
            consumer_seq: 1,
            published_nanos,
        }
    }

    #[test]
    fn a_message_is_due_at_its_store_time_plus_its_delay() {
        let stored = 1_000_000_000_000;
        let delay = Some(Duration::from_millis(1500));
        assert_eq!(
            left(ack(stored), delay, stored + 500_000_000),
            Some(Duration::from_millis(1000))
        );
        assert_eq!(left(ack(stored), delay, stored + 1_500_000_000), None);
        assert_eq!(left(ack(stored), None, stored), None, "no delay: due");
        assert_eq!(
            nak_after(Duration::from_millis(2)),
            "-NAK {\"delay\":2000000}"
        );
    }
}
