//! Deduplication stores: where [`DeduplicateStamp`](crate::DeduplicateStamp) keys are taken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::TransportError;

/// Takes deduplication keys for a while: a table on SQL (`<table>_dedup`, its expired rows
/// pruned by the transport), `SET NX PX` on Redis (expiring by themselves), a map in memory
/// (expired entries dropped as it grows). Reached through
/// [`Abilities::deduplicate`](crate::Abilities::deduplicate), or given to a bus with
/// [`MessageBusBuilder::deduplicate_store`](crate::MessageBusBuilder::deduplicate_store).
#[async_trait]
pub trait Deduplicate: Send + Sync {
    /// Takes `key` for `ttl` if it is free (never taken, or its TTL has passed): `true` when
    /// taken now, `false` when a holder within its TTL has it. Atomic: of many concurrent
    /// callers with one key, exactly one gets `true`.
    async fn deduplicate(&self, key: &str, ttl: Duration) -> Result<bool, TransportError>;

    /// Frees `key` (the send it was taken for failed). Freeing a free key is not an error.
    async fn release(&self, key: &str) -> Result<(), TransportError>;

    /// Whether this store's transport takes the key of a message's
    /// [`DeduplicateStamp`](crate::DeduplicateStamp) in its own send, in the same write as
    /// the message (SQL: the insert's transaction, or the caller's in `dispatch_in`), so that a
    /// key exists exactly when its message does. The bus then takes no key before sending to
    /// that transport: its send does, and returns the envelope with a
    /// [`DeduplicatedStamp`](crate::DeduplicatedStamp) naming the transport (its
    /// [`SentStamp`](crate::SentStamp)'s) and no transport id when the key was held. Only
    /// asked of a transport's own store ([`Abilities::deduplicate`](crate::Abilities::deduplicate));
    /// default `false`: the bus takes the key first and releases it if the send fails.
    fn takes_keys_on_send(&self) -> bool {
        false
    }
}

/// An in-process [`Deduplicate`] on tokio's clock (what
/// [`InMemoryTransport`](crate::InMemoryTransport) uses; also a bus-wide store for one process).
#[derive(Debug, Clone, Default)]
pub struct MemoryDeduplicator {
    keys: Arc<Mutex<HashMap<String, Instant>>>,
}

impl MemoryDeduplicator {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Deduplicate for MemoryDeduplicator {
    async fn deduplicate(&self, key: &str, ttl: Duration) -> Result<bool, TransportError> {
        let now = Instant::now();
        let mut keys = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if keys.len() > 1024 {
            keys.retain(|_, until| *until > now);
        }
        match keys.get(key) {
            Some(until) if *until > now => Ok(false),
            _ => {
                keys.insert(key.to_owned(), now + ttl);
                Ok(true)
            }
        }
    }

    async fn release(&self, key: &str) -> Result<(), TransportError> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
        Ok(())
    }
}
