//! The deduplication step: before a message with a
//! [`DeduplicateStamp`](crate::DeduplicateStamp) (or whose
//! [`Message::deduplicate`](crate::Message::deduplicate) gives one) is sent, its key is taken on
//! each target transport's store; a transport where it is taken already is dropped from the send.
//! A transport whose own store takes keys in its send
//! ([`Deduplicate::takes_keys_on_send`], SQL) is left to do so, in the same write as the message:
//! the envelope goes on with the stamp, and the send step reads the transport's answer.
//! Keys taken here are released when the send fails.

use std::sync::Arc;

use async_trait::async_trait;

use super::{MessageBus, Middleware, Next};
use crate::transport::Deduplicate;
use crate::{
    BusError, DeduplicateStamp, DeduplicatedStamp, Envelope, ReceivedStamp, TransportError,
    TransportErrorKind, TransportNamesStamp,
};

/// Runs just before send and handle (after user middleware), built into every bus.
pub(crate) struct Deduplication;

#[async_trait]
impl Middleware for Deduplication {
    async fn handle(&self, mut envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        if envelope.has::<ReceivedStamp>() {
            return next.run(envelope).await;
        }
        let Some(stamp) = envelope.deduplication() else {
            return next.run(envelope).await;
        };
        if stamp.ttl.is_zero() {
            return Err(zero_ttl(&envelope, &stamp));
        }
        let bus = next.bus;
        let names: Vec<String> = match envelope.last::<TransportNamesStamp>() {
            Some(TransportNamesStamp(names)) => names.clone(),
            None => bus.inner.router.resolve(envelope.message_name()).to_vec(),
        };
        let mut taken: Vec<(&dyn Deduplicate, String)> = Vec::new();
        let mut kept = Vec::new();
        let mut skipped = Vec::new();
        let targets: Vec<Option<String>> = if names.is_empty() {
            vec![None]
        } else {
            names.iter().cloned().map(Some).collect()
        };
        for target in targets {
            if target
                .as_deref()
                .is_some_and(|t| bus.transport(t).is_none())
            {
                // Unknown transport: the send step names it.
                kept.extend(target);
                continue;
            }
            if takes_keys_on_send(bus, target.as_deref()) {
                // Its send takes the key with the message, from the stamp on the envelope.
                if !envelope.has::<DeduplicateStamp>() {
                    envelope = envelope.with(stamp.clone());
                }
                kept.extend(target);
                continue;
            }
            let (store, key) = store_for(bus, target.as_deref(), &envelope, &stamp.key)?;
            let fresh = match store.deduplicate(&key, stamp.ttl).await {
                Ok(fresh) => fresh,
                Err(source) => {
                    release(&taken).await;
                    return Err(BusError::Send {
                        name: envelope.message_name().to_owned(),
                        source,
                    });
                }
            };
            if fresh {
                taken.push((store, key));
                kept.extend(target);
            } else {
                skipped.push(target.unwrap_or_default());
            }
        }
        if skipped.is_empty() {
            return run(next, envelope, &taken).await;
        }
        tracing::debug!(courier.dedup.key = %stamp.key, "duplicate message not sent");
        let mut envelope = envelope;
        for transport in skipped {
            envelope = envelope.with(DeduplicatedStamp {
                key: stamp.key.clone(),
                transport,
            });
        }
        if kept.is_empty() {
            return Ok(envelope.without_all::<TransportNamesStamp>());
        }
        let envelope = envelope
            .without_all::<TransportNamesStamp>()
            .with(TransportNamesStamp(kept));
        run(next, envelope, &taken).await
    }
}

async fn run(
    next: Next<'_>,
    envelope: Envelope,
    taken: &[(&dyn Deduplicate, String)],
) -> Result<Envelope, BusError> {
    let result = next.run(envelope).await;
    if result.is_err() {
        release(taken).await;
    }
    result
}

async fn release(taken: &[(&dyn Deduplicate, String)]) {
    for (store, key) in taken {
        if let Err(e) = store.release(key).await {
            tracing::warn!(error = %e, "could not release a deduplication key");
        }
    }
}

/// Whether the target transport's own store takes keys in its send (see
/// [`Deduplicate::takes_keys_on_send`]).
fn takes_keys_on_send(bus: &MessageBus, target: Option<&str>) -> bool {
    target
        .and_then(|name| bus.transport(name))
        .and_then(|t| t.as_deduplicate())
        .is_some_and(Deduplicate::takes_keys_on_send)
}

/// The store a key is taken on for one target (`None`: the message is handled here): the
/// transport's own, else the bus's (keys prefixed with the transport's name), else an error.
fn store_for<'b>(
    bus: &'b MessageBus,
    target: Option<&str>,
    envelope: &Envelope,
    key: &str,
) -> Result<(&'b dyn Deduplicate, String), BusError> {
    let own = target
        .and_then(|name| bus.transport(name))
        .and_then(|t| t.as_deduplicate());
    if let Some(store) = own {
        return Ok((store, key.to_owned()));
    }
    if let Some(store) = &bus.inner.dedup_store {
        let key = format!("{}:{key}", target.unwrap_or(""));
        return Ok((&**store as &dyn Deduplicate, key));
    }
    let transport = target.unwrap_or("(handled locally)").to_owned();
    Err(BusError::Send {
        name: envelope.message_name().to_owned(),
        source: TransportError::new(TransportErrorKind::Unsupported, transport).with_context(
            "this transport cannot deduplicate (DeduplicateStamp) and the bus has no deduplication store",
        ),
    })
}

/// A TTL of zero would free the key at once: refused rather than silently not deduplicating.
fn zero_ttl(envelope: &Envelope, stamp: &DeduplicateStamp) -> BusError {
    BusError::Send {
        name: envelope.message_name().to_owned(),
        source: TransportError::new(TransportErrorKind::Config, "deduplication").with_context(
            format!(
                "the deduplication ttl of key `{}` must be longer than zero",
                stamp.key
            ),
        ),
    }
}

/// Keeps the store type nameable in `BusInner`.
pub(crate) type Store = Arc<dyn Deduplicate>;
