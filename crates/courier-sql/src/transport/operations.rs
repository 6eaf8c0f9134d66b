//! The [`Transport`] contract of [`SqlTransport`].

use std::time::Duration;

use courier_core::{
    Capabilities, DelayStamp, Envelope, Transport, TransportError, TransportErrorKind, async_trait,
};

use super::SqlTransport;
use super::dedup::key_refs;
use crate::Dialect;

#[async_trait]
impl Transport for SqlTransport {
    fn messaging_system(&self) -> &'static str {
        match Dialect::from_scheme(self.dsn.scheme()) {
            Ok(Dialect::Postgres) => "postgresql",
            Ok(Dialect::Mysql) => "mysql",
            _ => "sqlite",
        }
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let mut sent = self.send_batch(vec![envelope]).await?;
        sent.pop()
            .ok_or_else(|| TransportError::new(TransportErrorKind::Protocol, self.name.clone()))
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        self.check_schema().await?;
        let rows = self.rows(&envelopes)?;
        if let Some(keys) = self.dedup_keys(&envelopes)? {
            // The keys are taken in the insert's transaction: a key exists exactly when its
            // message does, whatever happens to this send.
            let refs = key_refs(&keys);
            let ids = self
                .attempt(
                    "inserting messages and taking their deduplication keys",
                    || self.backend.insert_keyed(&rows, &refs),
                )
                .await?;
            if ids.iter().any(Option::is_some) {
                self.wake.bump();
            }
            self.prune_keys_when_due().await;
            return self.with_keyed_ids(envelopes, ids, &keys);
        }
        let ids = self
            .attempt("inserting messages", || self.backend.insert(&rows))
            .await?;
        self.wake.bump();
        self.with_ids(envelopes, ids)
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.check_schema().await?;
        self.get_after(max, Vec::new()).await
    }

    async fn ack_and_get(
        &self,
        acks: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        let mut pairs = Vec::with_capacity(acks.len());
        for envelope in acks {
            match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => pairs.push((id, delivery)),
                _ => self.ack(envelope).await?,
            }
        }
        if max == 0 {
            if !pairs.is_empty() {
                let deleted = self
                    .attempt("deleting messages", || self.backend.delete(&pairs))
                    .await?;
                self.slots_freed(deleted).await;
            }
            return Ok(Vec::new());
        }
        self.get_after(max, pairs).await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_delivery(envelope, "ack").await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_delivery(envelope, "reject").await
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let mut pairs = Vec::with_capacity(envelopes.len());
        // Envelopes with an id and no delivery (a drained batch resent by the relay): one
        // statement for all of them.
        let mut ids = Vec::new();
        for envelope in envelopes {
            match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => pairs.push((id, delivery)),
                (Some(id), None) => ids.push(id),
                (None, _) => self.ack(envelope).await?,
            }
        }
        if !ids.is_empty() {
            self.attempt("deleting messages", || self.backend.delete_ids(&ids))
                .await?;
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let deleted = self
            .attempt("deleting messages", || self.backend.delete(&pairs))
            .await?;
        self.slots_freed(deleted).await;
        if deleted < pairs.len() as u64 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                acked = pairs.len(),
                deleted,
                "some acks deleted nothing: already gone, or superseded by a redelivery"
            );
        }
        Ok(())
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let (id, delivery) = Self::delivery(&envelope);
        let next = envelope.clone().without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        let (Some(id), Some(delivery)) = (id, delivery) else {
            // Not one of our deliveries: at least once by the provided send-then-ack.
            self.send(next).await?;
            return self.ack(&envelope).await;
        };
        let row = self.new_row(&next, delay)?;
        let updated = self
            .attempt("rescheduling a message", || {
                self.backend.reschedule(id, delivery, &row)
            })
            .await?;
        if updated == 0 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                messaging.message.id = id,
                "retry updated nothing: the delivery was superseded by a redelivery, which now owns the message"
            );
        }
        self.wake.bump();
        Ok(())
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if let (Some(id), Some(delivery)) = Self::delivery(envelope) {
            let n = self
                .attempt("refreshing a delivery", || {
                    self.backend.keepalive(id, delivery)
                })
                .await?;
            if n == 0 {
                tracing::debug!(messaging.destination.name = %self.name, messaging.message.id = id, "keepalive of a delivery that is no longer live");
            }
        }
        Ok(())
    }

    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let pairs: Vec<(i64, i64)> = envelopes
            .iter()
            .filter_map(|envelope| match Self::delivery(envelope) {
                (Some(id), Some(delivery)) => Some((id, delivery)),
                _ => None,
            })
            .collect();
        if pairs.is_empty() {
            return Ok(());
        }
        let live = self
            .attempt("refreshing deliveries", || {
                self.backend.keepalive_many(&pairs)
            })
            .await?;
        if live < pairs.len() as u64 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                held = pairs.len(),
                live,
                "some kept-alive deliveries are no longer live"
            );
        }
        Ok(())
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.listable = Some(self);
        abilities.message_count = Some(self);
        abilities.queues = Some(self);
        abilities.any = Some(self);
        abilities.worker_registry = Some(&*self.workers);
        abilities.deduplicate = Some(self);
        abilities.schedule_store = Some(&*self.schedules);
        abilities.pausable = Some(&*self.pauses);
        abilities.relay_source = {
            (self.as_cursor().is_some() || self.as_drain().is_some())
                .then_some(self as &dyn courier_core::relay::RelaySource)
        };
        abilities.rate_limiter = Some(&*self.limits);
        abilities.keyed_queue = self
            .options
            .keyed()
            .then_some(self as &dyn courier_core::KeyedQueue);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::none()
            .with_delay(None)
            .with_priority()
            .with_get_wait(self.options.poll_window)
            .with_redeliver_after(self.options.redeliver_timeout);
        // PostgreSQL deletes and claims in one statement: the acks of one batch ride on the
        // claim of the next. Elsewhere it takes a transaction of its own, slower than the two
        // statements overlapped, so the worker keeps them apart. On SQLite even the two
        // statements in one call are slower: riding on the acks, the next claim waits for the
        // batch to finish instead of being fetched ahead.
        if matches!(
            Dialect::from_scheme(self.dsn.scheme()),
            Ok(Dialect::Postgres)
        ) {
            caps.with_ack_with_get()
        } else {
            caps
        }
    }
}
