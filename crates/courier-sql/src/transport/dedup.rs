//! Deduplication keys: those of the envelopes sent (taken in the insert's transaction), the
//! envelopes whose key was held, pruning expired keys, and [`Deduplicate`].

use std::time::Duration;

use courier_core::{
    Deduplicate, DeduplicateStamp, DeduplicatedStamp, Envelope, SentStamp, TransportError,
    TransportErrorKind, TransportMessageIdStamp, async_trait,
};

use super::SqlTransport;

impl SqlTransport {
    /// The deduplication key and TTL (ms) of each envelope's
    /// [`DeduplicateStamp`](courier_core::DeduplicateStamp); `None` when no envelope has one.
    pub(super) fn dedup_keys(
        &self,
        envelopes: &[Envelope],
    ) -> Result<Option<Vec<Key>>, TransportError> {
        if !envelopes.iter().any(|e| e.has::<DeduplicateStamp>()) {
            return Ok(None);
        }
        let mut keys = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let Some(stamp) = envelope.last::<DeduplicateStamp>() else {
                keys.push(None);
                continue;
            };
            self.check_key(&stamp.key)?;
            let ttl_ms = i64::try_from(stamp.ttl.as_millis()).unwrap_or(i64::MAX / 4);
            keys.push(Some((stamp.key.clone(), ttl_ms)));
        }
        Ok(Some(keys))
    }

    /// Refuses a key longer than the table holds.
    pub(super) fn check_key(&self, key: &str) -> Result<(), TransportError> {
        if key.len() > crate::dedup::MAX_KEY_BYTES {
            return Err(
                TransportError::new(TransportErrorKind::Unsupported, self.name.clone())
                    .with_context(format!(
                        "deduplication key of {} bytes exceeds the maximum of {}",
                        key.len(),
                        crate::dedup::MAX_KEY_BYTES
                    )),
            );
        }
        Ok(())
    }

    /// The envelopes with the ids their rows got; those whose key was held get a
    /// [`DeduplicatedStamp`] instead, naming the transport they were sent to (their last
    /// [`SentStamp`], else this transport's name).
    pub(super) fn with_keyed_ids(
        &self,
        envelopes: Vec<Envelope>,
        ids: Vec<Option<i64>>,
        keys: &[Key],
    ) -> Result<Vec<Envelope>, TransportError> {
        if ids.len() != envelopes.len() {
            return Err(
                TransportError::new(TransportErrorKind::Protocol, self.name.clone()).with_context(
                    format!(
                        "inserted {} rows for {} messages",
                        ids.len(),
                        envelopes.len()
                    ),
                ),
            );
        }
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .zip(keys)
            .map(|((e, id), key)| match (id, key) {
                (Some(id), _) => e.with(TransportMessageIdStamp(id.to_string())),
                (None, key) => {
                    let transport = e
                        .last::<SentStamp>()
                        .map_or_else(|| self.name.clone(), |s| s.transport.clone());
                    let key = key.as_ref().map(|(k, _)| k.clone()).unwrap_or_default();
                    tracing::debug!(courier.dedup.key = %key, transport = %transport,
                        "duplicate message not sent");
                    e.with(DeduplicatedStamp { key, transport })
                }
            })
            .collect())
    }

    /// Deletes a bounded pass of expired deduplication keys when one is due (see the `dedup`
    /// module); a failure is logged and the next pass waits its interval.
    pub(super) async fn prune_keys_when_due(&self) {
        let Some(turn) = self.dedup_prune.turn() else {
            return;
        };
        match self.backend.dedup_prune(crate::dedup::PRUNE_BATCH).await {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(transport = %self.name, keys = n, "expired deduplication keys pruned");
                }
                turn.pruned(n);
            }
            Err(e) => {
                tracing::debug!(transport = %self.name, error = %e,
                    "could not prune expired deduplication keys");
            }
        }
    }
}

/// Keys in `<table>_dedup` (see the `dedup` module): at most 190 bytes. The bus leaves the key
/// of a message sent here to the send itself ([`takes_keys_on_send`](Deduplicate::takes_keys_on_send)),
/// which takes it in the insert's transaction; [`deduplicate`](Deduplicate::deduplicate) takes one
/// alone (for messages sent elsewhere, with this transport as a bus's store).
#[async_trait]
impl Deduplicate for SqlTransport {
    async fn deduplicate(&self, key: &str, ttl: Duration) -> Result<bool, TransportError> {
        self.check_key(key)?;
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX / 4);
        let taken = self
            .attempt("taking a deduplication key", || {
                self.backend.dedup_take(key, ttl_ms)
            })
            .await?;
        self.prune_keys_when_due().await;
        Ok(taken)
    }

    fn takes_keys_on_send(&self) -> bool {
        true
    }

    async fn release(&self, key: &str) -> Result<(), TransportError> {
        self.attempt("releasing a deduplication key", || {
            self.backend.dedup_release(key)
        })
        .await
    }
}

/// The deduplication key and TTL (ms) of one envelope to insert, if it has one.
pub(super) type Key = Option<(String, i64)>;

/// The keys as the backend takes them.
pub(super) fn key_refs(keys: &[Key]) -> Vec<Option<(&str, i64)>> {
    keys.iter()
        .map(|k| k.as_ref().map(|(key, ttl)| (key.as_str(), *ttl)))
        .collect()
}
