//! Deduplication checks every transport with a deduplication store runs
//! ([`Abilities::deduplicate`](courier_core::Abilities::deduplicate)).

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    DeduplicateStamp, DeduplicatedStamp, Envelope, MessageBus, SentStamp, Transport,
};

use crate::{TestMessage, registry};

/// A bus that routes [`TestMessage`] to `transport` under the name `"dedup"`.
#[must_use]
pub fn bus(transport: Arc<dyn Transport>) -> MessageBus {
    MessageBus::builder()
        .messages(registry())
        .transport("dedup", transport)
        .route(<TestMessage as courier_core::Message>::NAME, ["dedup"])
        .build()
}

/// Dispatches `n` copies of one message with the same key at once; asserts that exactly one
/// was sent and every other came back with a [`DeduplicatedStamp`].
///
/// # Panics
/// When not exactly one was sent, or a dispatch failed or took more than 30 s.
pub async fn concurrent_dispatches_send_exactly_one(bus: &MessageBus, key: &str, n: usize) {
    let dispatches = (0..n).map(|i| {
        let bus = bus.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            let envelope = Envelope::new(TestMessage::new(i as u64))
                .with(DeduplicateStamp::new(key, Duration::from_secs(3600)));
            bus.dispatch(envelope).await
        })
    });
    let results = tokio::time::timeout(
        Duration::from_secs(30),
        futures_util::future::join_all(dispatches),
    )
    .await
    .expect("100 dispatches within 30 s");
    let mut sent = 0;
    let mut deduplicated = 0;
    for result in results {
        let envelope = result.expect("dispatch task").expect("dispatch");
        if envelope.has::<SentStamp>() {
            sent += 1;
        }
        if envelope.has::<DeduplicatedStamp>() {
            deduplicated += 1;
        }
    }
    assert_eq!(sent, 1, "exactly one of {n} dispatches is sent");
    assert_eq!(deduplicated, n - 1, "every other one is deduplicated");
}

/// Dispatches one message with `key` and `ttl`; whether it was sent.
///
/// # Panics
/// When the dispatch fails or takes more than 30 s.
pub async fn dispatch_once(bus: &MessageBus, key: &str, ttl: Duration) -> bool {
    let envelope =
        Envelope::new(TestMessage::new(0)).with(DeduplicateStamp::new(key.to_owned(), ttl));
    let envelope = tokio::time::timeout(Duration::from_secs(30), bus.dispatch(envelope))
        .await
        .expect("dispatch within 30 s")
        .expect("dispatch");
    assert_ne!(
        envelope.has::<SentStamp>(),
        envelope.has::<DeduplicatedStamp>(),
        "sent or deduplicated, not both"
    );
    envelope.has::<SentStamp>()
}

/// Dispatches one message (`seq`) with `key` held for an hour, within 30 s: what the dispatch
/// returned.
///
/// # Panics
/// When the dispatch takes more than 30 s.
pub async fn try_dispatch(
    bus: &MessageBus,
    key: &str,
    seq: u64,
) -> Result<Envelope, courier_core::BusError> {
    tokio::time::timeout(Duration::from_secs(30), bus.dispatch(keyed(key, seq)))
        .await
        .expect("dispatch within 30 s")
}

/// A [`TestMessage`] (`seq`) with a [`DeduplicateStamp`] holding `key` for an hour.
#[must_use]
pub fn keyed(key: &str, seq: u64) -> Envelope {
    Envelope::new(TestMessage::new(seq)).with(DeduplicateStamp::new(
        key.to_owned(),
        Duration::from_secs(3600),
    ))
}

/// Whether the envelope a dispatch returned was sent (a [`SentStamp`] and no
/// [`DeduplicatedStamp`]); panics when it carries both or neither.
///
/// # Panics
/// When the envelope is both sent and deduplicated, or neither.
#[must_use]
pub fn was_sent(envelope: &Envelope) -> bool {
    assert_ne!(
        envelope.has::<SentStamp>(),
        envelope.has::<DeduplicatedStamp>(),
        "sent or deduplicated, not both: {envelope:?}"
    );
    envelope.has::<SentStamp>()
}
