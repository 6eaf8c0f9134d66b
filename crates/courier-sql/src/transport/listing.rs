//! Listing, counting, the concurrency keys' loads and other queues of the table: [`Listable`],
//! [`MessageCount`], [`KeyedQueue`](courier_core::KeyedQueue) and [`Queues`].

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    Envelope, Listable, MessageCount, Queues, Transport, TransportError, TransportErrorKind,
    async_trait,
};

use super::SqlTransport;

#[async_trait]
impl Listable for SqlTransport {
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError> {
        let rows = self
            .attempt("listing messages", || self.backend.list(limit))
            .await?;
        Ok(self.decode_all(rows).collect())
    }

    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        let row = self
            .attempt("finding a message", || self.backend.find(id))
            .await?;
        Ok(self.decode_all(row).next())
    }

    async fn remove(&self, id: &str) -> Result<bool, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(false);
        };
        let n = self
            .attempt("removing a message", || {
                self.backend.delete_ids(std::slice::from_ref(&id))
            })
            .await?;
        Ok(n > 0)
    }
}

#[async_trait]
impl MessageCount for SqlTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        let n = self
            .attempt("counting messages", || self.backend.count())
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// From the oldest row's `created_at` and the database clock.
    async fn oldest_age(&self) -> Result<Option<Duration>, TransportError> {
        let ms = self
            .attempt("reading the oldest message's age", || {
                self.backend.oldest_age_ms()
            })
            .await?;
        Ok(ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
    }
}

/// Another `queue_name` of the same table, on a pool of its own (`consume --queues`); the table
/// is already set up by this transport.
#[async_trait]
impl Queues for SqlTransport {
    async fn queue(&self, queue: &str) -> Result<Arc<dyn Transport>, TransportError> {
        if queue.is_empty() || queue.len() > 190 {
            return Err(
                TransportError::new(TransportErrorKind::Config, self.name.clone())
                    .with_context("invalid queue name: expected 1 to 190 bytes"),
            );
        }
        let options = self.options.clone().queue_name(queue).auto_setup(false);
        let view = match &self.shared_pool {
            Some((pool, _)) => {
                Self::from_pool(
                    self.name.clone(),
                    pool.clone(),
                    options,
                    self.registry.clone(),
                )
                .await?
            }
            None => {
                Self::connect_with(self.name.clone(), &self.dsn, options, self.registry.clone())
                    .await?
            }
        };
        Ok(Arc::new(view))
    }
}

/// A keyed queue's loads: one `GROUP BY concurrency_key` over the queue's rows.
#[async_trait]
impl courier_core::KeyedQueue for SqlTransport {
    async fn key_loads(&self, top: usize) -> Result<courier_core::KeyLoads, TransportError> {
        let rows = self
            .attempt("reading the concurrency keys", || self.backend.key_loads())
            .await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let loads = rows
            .into_iter()
            .map(|(key, in_flight, queued)| courier_core::KeyLoad {
                key,
                in_flight: count(in_flight),
                queued: count(queued),
            })
            .collect();
        Ok(courier_core::KeyLoads::top(
            self.options.concurrency_max,
            loads,
            top,
        ))
    }
}
