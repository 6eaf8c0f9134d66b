//! Testing your handlers: typed assertions on what was dispatched to an [`InMemoryTransport`],
//! and a worker run until its transports are empty, on tokio's paused clock.
//!
//! Route the messages under test to an in-memory transport, run the code, then:
//!
//! - [`InMemoryTransport::assert_dispatched`] finds a message by type (decoded to it, with its
//!   stamps) and checks it off; [`InMemoryTransport::assert_dispatched_where`] picks one by a
//!   predicate, [`InMemoryTransport::assert_dispatched_times`] takes all of a type;
//! - [`InMemoryTransport::assert_not_dispatched`]: no message of a type at all;
//! - [`InMemoryTransport::assert_nothing_else_dispatched`]: everything dispatched was checked off.
//!
//! A failed assertion panics with the transport's name and the list of what was dispatched
//! (wire names and stamps, never message bodies). A worker's own sends (a retry, a message
//! released on stop) are not dispatches and are left out; [`InMemoryTransport::sent`] has them.
//!
//! [`run_until_empty`] runs a worker until every transport it consumes is empty, then stops it.
//! Under `#[tokio::test(start_paused = true)]` (tokio's `test-util` feature) tokio's clock jumps
//! to the next timer whenever the runtime is idle, so delayed messages
//! ([`DelayStamp`](crate::DelayStamp)) and retry backoffs are due at once: a message delayed by
//! three days is handled without real waiting.
//!
//! ```
//! use courier_core::testing::run_until_empty;
//! use courier_core::{DelayStamp, Envelope, HandlerError, InMemoryTransport, Message, MessageBus, Worker};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! #[derive(Serialize, Deserialize)]
//! struct UserSignedUp { email: String }
//! impl Message for UserSignedUp { const NAME: &'static str = "users.signed_up"; }
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendMail { to: String, template: String }
//! impl Message for SendMail { const NAME: &'static str = "mail.send"; }
//!
//! const THREE_DAYS: Duration = Duration::from_secs(3 * 86_400);
//!
//! // The handler under test: a welcome mail now, tips in three days.
//! async fn on_signup(m: Arc<UserSignedUp>) -> Result<(), HandlerError> {
//!     let bus = MessageBus::current().expect("inside a handler");
//!     let mail = |template: &str| SendMail { to: m.email.clone(), template: template.into() };
//!     bus.dispatch(mail("welcome")).await?;
//!     bus.dispatch(Envelope::new(mail("tips")).with(DelayStamp(THREE_DAYS))).await?;
//!     Ok(())
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
//! // #[tokio::test(start_paused = true)]
//! let queue = Arc::new(InMemoryTransport::new());
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("*", ["async"])
//!     .handler_fn("on_signup", on_signup)
//!     .handler_fn("send_mail", |_: Arc<SendMail>| async { Ok::<(), HandlerError>(()) })
//!     .build();
//! bus.dispatch(UserSignedUp { email: "ada@example.com".into() }).await?;
//!
//! let stats = run_until_empty(Worker::builder(bus).receiver("async", queue.clone()).build()).await?;
//! assert_eq!(stats.handled, 3); // the signup and both mails, the second three days later
//!
//! queue.assert_dispatched::<UserSignedUp>();
//! let welcome = queue.assert_dispatched_where::<SendMail>(|m| m.template == "welcome");
//! assert_eq!(welcome.to, "ada@example.com");
//! assert!(welcome.stamp::<DelayStamp>().is_none());
//! let tips = queue.assert_dispatched_where::<SendMail>(|m| m.template == "tips");
//! assert_eq!(tips.stamp::<DelayStamp>(), Some(&DelayStamp(THREE_DAYS)));
//! queue.assert_nothing_else_dispatched();
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::fmt::{self, Write as _};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    CancellationToken, Envelope, InMemoryTransport, Message, Stamp, Transport, Worker, WorkerError,
    WorkerEvent, WorkerStats,
};

/// How long, in tokio time, [`run_until_empty`] waits for the transports to empty before it
/// gives up: a week (a fraction of a second on the paused clock). [`run_until_empty_within`]
/// takes another.
pub const RUN_UNTIL_EMPTY_LIMIT: Duration = Duration::from_secs(7 * 86_400);

/// A message of type `M` dispatched to an [`InMemoryTransport`], decoded, with its envelope (and
/// so its stamps). Dereferences to the message.
pub struct Dispatched<M: Message> {
    message: Arc<M>,
    envelope: Envelope,
    position: usize,
}

impl<M: Message> Clone for Dispatched<M> {
    fn clone(&self) -> Self {
        Self {
            message: self.message.clone(),
            envelope: self.envelope.clone(),
            position: self.position,
        }
    }
}

impl<M: Message> fmt::Debug for Dispatched<M> {
    /// The position, wire name and stamps; never the message's body.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatched")
            .field("position", &self.position)
            .field("envelope", &self.envelope)
            .finish()
    }
}

impl<M: Message> Deref for Dispatched<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.message
    }
}

impl<M: Message> Dispatched<M> {
    /// The message.
    #[must_use]
    pub fn message(&self) -> &M {
        &self.message
    }

    /// The envelope as it was sent (its stamps, with the transport's id).
    #[must_use]
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Its last stamp of kind `S` ([`Envelope::last`]).
    #[must_use]
    pub fn stamp<S: Stamp>(&self) -> Option<&S> {
        self.envelope.last::<S>()
    }

    /// Its position among everything sent to the transport (1 for the first send).
    #[must_use]
    pub fn position(&self) -> usize {
        self.position
    }
}

/// A dispatch (not a worker's retry) found in the records, at its index.
struct Candidate {
    index: usize,
    envelope: Envelope,
    checked: bool,
}

impl InMemoryTransport {
    /// The dispatches recorded (a worker's retries left out), in order.
    fn dispatches(&self) -> Vec<Candidate> {
        self.records()
            .into_iter()
            .enumerate()
            .filter(|(_, r)| !r.retry)
            .map(|(index, r)| Candidate {
                index,
                envelope: r.envelope,
                checked: r.checked,
            })
            .collect()
    }

    /// Every message of type `M` dispatched here, in order, decoded, checked off or not (a
    /// worker's retries left out). Checks nothing off.
    #[must_use]
    pub fn dispatched<M: Message>(&self) -> Vec<Dispatched<M>> {
        self.dispatches()
            .into_iter()
            .filter_map(|c| typed::<M>(&c))
            .collect()
    }

    /// Asserts that a message of type `M` was dispatched here and checks it off: returns the
    /// first one not checked off yet, decoded, with its stamps.
    ///
    /// # Panics
    /// When every `M` dispatched here was checked off already, or none was; the message lists
    /// what was dispatched.
    #[track_caller]
    pub fn assert_dispatched<M: Message>(&self) -> Dispatched<M> {
        self.take_first::<M>(|_| true, "")
    }

    /// Asserts that a message of type `M` for which `matches` is true was dispatched here, and
    /// checks off the first such one not checked off yet.
    ///
    /// # Panics
    /// When no `M` not checked off matches; the message lists what was dispatched.
    #[track_caller]
    pub fn assert_dispatched_where<M: Message>(
        &self,
        matches: impl Fn(&Dispatched<M>) -> bool,
    ) -> Dispatched<M> {
        self.take_first::<M>(matches, " matching the predicate")
    }

    /// Asserts that exactly `n` messages of type `M` not checked off yet were dispatched here,
    /// and checks them all off; returns them in order.
    ///
    /// # Panics
    /// When there are more or fewer; the message lists what was dispatched.
    #[track_caller]
    pub fn assert_dispatched_times<M: Message>(&self, n: usize) -> Vec<Dispatched<M>> {
        let dispatches = self.dispatches();
        let found: Vec<Dispatched<M>> = dispatches
            .iter()
            .filter(|c| !c.checked)
            .filter_map(typed::<M>)
            .collect();
        if found.len() != n {
            panic!(
                "expected {n} `{}` message(s) ({}) dispatched to `{}` (not checked off yet), found {}; {}",
                M::NAME,
                std::any::type_name::<M>(),
                self.name(),
                found.len(),
                listing(&dispatches)
            );
        }
        for d in &found {
            self.check_off(d.position - 1);
        }
        found
    }

    /// Asserts that no message of type `M` was dispatched here (checked off or not).
    ///
    /// # Panics
    /// When one was; the message lists what was dispatched.
    #[track_caller]
    pub fn assert_not_dispatched<M: Message>(&self) {
        let dispatches = self.dispatches();
        let found = dispatches
            .iter()
            .filter(|c| typed::<M>(c).is_some())
            .count();
        if found > 0 {
            panic!(
                "expected no {} dispatched to `{}`, found {found}; {}",
                what::<M>(),
                self.name(),
                listing(&dispatches)
            );
        }
    }

    /// Asserts that every message dispatched here was checked off by an `assert_dispatched*`
    /// call: nothing else was dispatched. With nothing checked off: nothing was dispatched.
    ///
    /// # Panics
    /// When a dispatch was not checked off; the message lists them.
    #[track_caller]
    pub fn assert_nothing_else_dispatched(&self) {
        let dispatches = self.dispatches();
        let left = dispatches.iter().filter(|c| !c.checked).count();
        if left > 0 {
            panic!(
                "expected nothing else dispatched to `{}`, found {left} message(s) not checked off; {}",
                self.name(),
                listing(&dispatches)
            );
        }
    }

    #[track_caller]
    fn take_first<M: Message>(
        &self,
        matches: impl Fn(&Dispatched<M>) -> bool,
        how: &str,
    ) -> Dispatched<M> {
        // The predicate runs without the transport's lock held (it may look at the transport).
        let dispatches = self.dispatches();
        let found = dispatches
            .iter()
            .filter(|c| !c.checked)
            .filter_map(typed::<M>)
            .find(|d| matches(d));
        match found {
            Some(d) => {
                self.check_off(d.position - 1);
                d
            }
            None => panic!(
                "expected a {}{how} dispatched to `{}`, found none not checked off yet; {}",
                what::<M>(),
                self.name(),
                listing(&dispatches)
            ),
        }
    }
}

fn typed<M: Message>(c: &Candidate) -> Option<Dispatched<M>> {
    Some(Dispatched {
        message: c.envelope.message_arc::<M>()?,
        envelope: c.envelope.clone(),
        position: c.index + 1,
    })
}

/// `` `mail.send` message (my_app::SendMail) ``.
fn what<M: Message>() -> String {
    format!("`{}` message ({})", M::NAME, std::any::type_name::<M>())
}

/// What was dispatched, one line each: position, wire name, stamps, checked off or not.
fn listing(dispatches: &[Candidate]) -> String {
    if dispatches.is_empty() {
        return "nothing was dispatched there".to_owned();
    }
    let mut out = String::from("dispatched there:");
    for c in dispatches {
        let stamps: Vec<&str> = c.envelope.stamp_names().collect();
        let _ = write!(
            out,
            "\n  #{} `{}` stamps [{}]{}",
            c.index + 1,
            c.envelope.message_name(),
            stamps.join(", "),
            if c.checked { " (checked off)" } else { "" }
        );
    }
    out
}

/// Runs `worker` until every transport it consumes is empty (every message handled and acked,
/// retried messages included), then stops it and returns its statistics; or until it stops by
/// itself (a limit). Gives up after [`RUN_UNTIL_EMPTY_LIMIT`] of tokio time.
///
/// Meant for `#[tokio::test(start_paused = true)]`: tokio's clock then jumps ahead whenever the
/// runtime is idle, so delays, retry backoffs and the worker's idle sleeps take no real time.
/// On a running clock it works too, at real speed. Where every transport the worker consumes is
/// an [`InMemoryTransport`], a fetch that finds nothing waits for the next message to come due
/// (or for a send or an ack) rather than the worker polling every `sleep`, so a delay of days
/// costs a few fetches; other transports are polled as usual, and checked for emptiness each
/// time a fetch finds nothing.
///
/// # Errors
/// [`WorkerError`] when the worker cannot start, or when a transport it consumes cannot count
/// its messages ([`Abilities::message_count`](crate::Abilities::message_count): the in-memory and SQL transports can).
///
/// # Panics
/// When the transports still hold messages after the limit: a message that keeps failing with
/// no failure transport, a delay longer than the limit ([`run_until_empty_within`]). The message
/// names the transports and what they hold.
pub async fn run_until_empty(worker: Worker) -> Result<WorkerStats, WorkerError> {
    run_until_empty_within(worker, RUN_UNTIL_EMPTY_LIMIT).await
}

/// [`run_until_empty`], giving up after `limit` of tokio time.
///
/// # Errors
/// As [`run_until_empty`].
///
/// # Panics
/// As [`run_until_empty`].
pub async fn run_until_empty_within(
    mut worker: Worker,
    limit: Duration,
) -> Result<WorkerStats, WorkerError> {
    // Where every receiver is in memory, its fetch waits for the next message to come due (or
    // for a send or an ack) instead of the worker polling every `sleep`: on the paused clock a
    // delay of days is then a few fetches, not one per second of it.
    if worker
        .receivers
        .iter()
        .all(|r| memory(&*r.transport).is_some())
    {
        for r in &mut worker.receivers {
            if let Some(inner) = memory(&*r.transport) {
                r.transport = Arc::new(Draining(inner.clone()));
            }
        }
    }
    let receivers: Vec<(String, Arc<dyn Transport>)> = worker
        .receivers
        .iter()
        .map(|r| (r.name.clone(), r.transport.clone()))
        .collect();
    if let Some((name, _)) = receivers
        .iter()
        .find(|(_, t)| t.as_message_count().is_none())
    {
        return Err(WorkerError::InvalidOption {
            option: "receiver",
            reason: format!(
                "`{name}` cannot count its messages, so run_until_empty cannot tell when it is empty"
            ),
        });
    }
    worker.options.heartbeat_metric = false;
    // The worker reports `Idle` when a fetch found nothing: the moment to count.
    let idle = Arc::new(tokio::sync::Notify::new());
    let notify = idle.clone();
    worker.listeners.push(Arc::new(move |event: &WorkerEvent| {
        if matches!(event, WorkerEvent::Idle) {
            notify.notify_one();
        }
    }));
    let shutdown = CancellationToken::new();
    let run = worker.run(shutdown.clone());
    tokio::pin!(run);
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            stats = &mut run => return stats,
            () = idle.notified() => {
                if held(&receivers).await.is_empty() {
                    shutdown.cancel();
                    return run.await;
                }
            }
            () = &mut deadline => {
                shutdown.cancel();
                let _stopped = run.await;
                let left = held(&receivers).await;
                panic!(
                    "run_until_empty: after {limit:?} of tokio time the worker's transports still \
                     hold messages ({}); a message that keeps failing without a failure transport \
                     is delivered again forever, and a delay longer than the limit needs \
                     run_until_empty_within",
                    left.join("; ")
                );
            }
        }
    }
}

/// What each non-empty receiver holds: `async: 2 message(s) [mail.send, mail.send]` (the names
/// where the transport lists its messages; a count that failed is shown as such).
async fn held(receivers: &[(String, Arc<dyn Transport>)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, transport) in receivers {
        let Some(counter) = transport.as_message_count() else {
            continue;
        };
        let count = match counter.message_count().await {
            Ok(0) => continue,
            Ok(n) => n,
            Err(e) => {
                out.push(format!("`{name}`: cannot count: {e}"));
                continue;
            }
        };
        let names = match transport.as_listable() {
            Some(list) => match list.list(10).await {
                Ok(envelopes) => {
                    let names: Vec<&str> = envelopes.iter().map(Envelope::message_name).collect();
                    format!(" [{}]", names.join(", "))
                }
                Err(_) => String::new(),
            },
            None => String::new(),
        };
        out.push(format!("`{name}`: {count} message(s){names}"));
    }
    out
}

fn memory(transport: &dyn Transport) -> Option<&InMemoryTransport> {
    transport.as_any()?.downcast_ref::<InMemoryTransport>()
}

/// The longest a [`Draining`] fetch waits (its poll window).
const DRAIN_WAIT: Duration = Duration::from_secs(3600);

/// An in-memory receiver of [`run_until_empty`] whose fetch, finding nothing, waits until the
/// next stored message comes due (or a send, ack or reject) and fetches once more: a blocking
/// fetch, so the worker does not sleep between fetches. Everything else is the transport's.
#[derive(Debug)]
struct Draining(InMemoryTransport);

#[async_trait::async_trait]
impl Transport for Draining {
    fn messaging_system(&self) -> &'static str {
        self.0.messaging_system()
    }
    async fn send(&self, envelope: Envelope) -> Result<Envelope, crate::TransportError> {
        self.0.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, crate::TransportError> {
        // Registered before looking, so a change in between still wakes it.
        let changed = self.0.changed().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let got = self.0.get(max).await?;
        if !got.is_empty() || max == 0 {
            return Ok(got);
        }
        let Some(due) = self.0.next_due() else {
            // Nothing stored: the worker reports Idle and the count finds it empty. Yield first:
            // a fetch that never waits would keep the worker's loop from ever giving way.
            tokio::task::yield_now().await;
            return Ok(got);
        };
        let until = due.min(tokio::time::Instant::now() + DRAIN_WAIT);
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = changed => {}
        }
        self.0.get(max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), crate::TransportError> {
        self.0.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), crate::TransportError> {
        self.0.reject(envelope).await
    }
    async fn retry(
        &self,
        envelope: Envelope,
        delay: Duration,
    ) -> Result<(), crate::TransportError> {
        self.0.retry(envelope, delay).await
    }
    async fn keepalive(&self, envelope: &Envelope) -> Result<(), crate::TransportError> {
        self.0.keepalive(envelope).await
    }
    fn abilities(&self) -> crate::Abilities<'_> {
        let inner = self.0.abilities();
        crate::Abilities {
            setup: inner.setup,
            listable: inner.listable,
            message_count: inner.message_count,
            deduplicate: inner.deduplicate,
            rate_limiter: inner.rate_limiter,
            any: inner.any,
            ..crate::Abilities::none()
        }
    }
    fn capabilities(&self) -> crate::Capabilities {
        self.0.capabilities().with_get_wait(DRAIN_WAIT)
    }
}
