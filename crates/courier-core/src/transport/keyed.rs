//! [`KeyedQueue`]: a queue with flow control per concurrency key, read for its keys' loads.

use async_trait::async_trait;

use crate::{KeyLoads, TransportError};

/// A queue whose messages carry a concurrency key (a
/// [`ConcurrencyKeyStamp`](crate::ConcurrencyKeyStamp), or `[limits.concurrency]` in the
/// configuration): how busy each key is, for `courier stats --keys`, the dashboard and the
/// per-key gauges. A transport offers it ([`Abilities::keyed_queue`](crate::Abilities::keyed_queue))
/// only when it is such a queue.
///
/// ```
/// use courier_core::{KeyLoad, KeyLoads, KeyedQueue, TransportError, async_trait};
///
/// struct OneKey;
///
/// #[async_trait]
/// impl KeyedQueue for OneKey {
///     async fn key_loads(&self, top: usize) -> Result<KeyLoads, TransportError> {
///         let load = KeyLoad { key: "tenant-1".into(), in_flight: 2, queued: 7 };
///         Ok(KeyLoads::top(Some(3), vec![load], top))
///     }
/// }
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let loads = OneKey.key_loads(10).await?;
/// assert_eq!((loads.keys[0].in_flight, loads.max), (2, Some(3)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[async_trait]
pub trait KeyedQueue: Send + Sync {
    /// The `top` busiest keys (in flight, then queued: ready to deliver, delayed messages not
    /// counted) and the rest summed as `other` ([`KeyLoads::top`]), so that what is shown or
    /// exported stays bounded however many keys there are.
    async fn key_loads(&self, top: usize) -> Result<KeyLoads, TransportError>;
}
