//! A source's own way of being relayed: what a transport offers where it can do better than
//! `get` then `ack_batch` (SQL on PostgreSQL drains its outbox, or reads it by a cursor).

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{Relay, RelayStats};
use crate::TransportError;

/// How a relay reads a source that offers one, through
/// [`Abilities::relay_source`](crate::Abilities::relay_source): [`Relay::run`] hands it
/// the relay, whose steps ([`Relay::send`], [`Relay::retrying`], [`Relay::bounded`],
/// [`Relay::count`], [`Relay::probe`]...) it runs its pipeline with, and whose options it
/// honours (the limit, the hold limit, the backoff, the probe points).
#[async_trait]
pub trait RelaySource: Send + Sync {
    /// Forwards the source's messages to `relay`'s destination until `shutdown` is cancelled
    /// or [`RelayOptions::limit`](super::RelayOptions::limit) messages are forwarded, with the
    /// guarantees of [`Relay::run`].
    ///
    /// # Errors
    /// As [`Relay::run`].
    async fn relay(
        &self,
        relay: &Relay,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError>;

    /// Whether the relay alone reads this source, so workers must not consume it (a cursor's
    /// rows are the cursor's to delete). The default: workers may.
    fn relay_only(&self) -> bool {
        false
    }
}

const _: () = {
    fn _obj_safe(_: &dyn RelaySource) {}
};
