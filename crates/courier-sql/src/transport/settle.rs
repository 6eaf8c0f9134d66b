//! Settling one delivery: deleting it by its id and delivery id, and waking consumers when that
//! freed a slot.

use courier_core::{DeliveryTagStamp, Envelope, TransportError, TransportMessageIdStamp};

use super::SqlTransport;

impl SqlTransport {
    /// The (id, delivery id) of an envelope this transport delivered.
    pub(super) fn delivery(envelope: &Envelope) -> (Option<i64>, Option<i64>) {
        let id = envelope
            .last::<TransportMessageIdStamp>()
            .and_then(|s| s.0.parse().ok());
        let delivery = envelope
            .last::<DeliveryTagStamp>()
            .and_then(|s| s.0.parse().ok());
        (id, delivery)
    }

    /// After acks deleted `deleted` delivered rows of a queue with a concurrency limit: their
    /// slots are free, so waiting consumers are woken (this process's at once, other
    /// processes' by `NOTIFY` on PostgreSQL; on SQLite and MySQL they poll).
    pub(super) async fn slots_freed(&self, deleted: u64) {
        if deleted == 0 || self.options.concurrency_max.is_none() {
            return;
        }
        self.wake.bump();
        if let Err(e) = self.backend.slots_freed().await {
            tracing::debug!(transport = %self.name, error = %e,
                "could not wake other consumers after an ack; they find the free slot at their next poll");
        }
    }

    pub(super) async fn remove_delivery(
        &self,
        envelope: &Envelope,
        verb: &'static str,
    ) -> Result<(), TransportError> {
        let deleted = match Self::delivery(envelope) {
            (Some(id), Some(delivery)) => {
                let deleted = self
                    .attempt("deleting a message", || {
                        self.backend.delete_one(id, delivery)
                    })
                    .await?;
                self.slots_freed(deleted).await;
                deleted
            }
            (Some(id), None) => {
                self.attempt("deleting a message", || {
                    self.backend.delete_ids(std::slice::from_ref(&id))
                })
                .await?
            }
            (None, _) => {
                tracing::debug!(messaging.destination.name = %self.name, "{verb} of an envelope without a transport id: nothing to delete");
                return Ok(());
            }
        };
        if deleted == 0 {
            tracing::debug!(
                messaging.destination.name = %self.name,
                messaging.message.id = envelope.id().unwrap_or_default(),
                "{verb} deleted nothing: already gone, or the delivery was superseded by a redelivery"
            );
        }
        Ok(())
    }
}
