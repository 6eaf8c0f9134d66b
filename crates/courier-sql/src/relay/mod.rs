//! How a relay reads an SQL outbox on PostgreSQL: the two [`RelaySource`]s an
//! [`SqlTransport`] offers ([`Abilities::relay_source`](courier_core::Abilities::relay_source)).
//!
//! A queue with `cursor=true` is read by a cursor ([`CursorSource`]): the relay reads past it
//! without writing anything and deletes what was relayed as one range; workers do not consume
//! it. Any other PostgreSQL queue drains ([`Drain`]): each batch is deleted in a transaction
//! held while it is sent. SQLite and MySQL queues offer neither: the relay reads them with
//! `get` then `ack_batch`. The pipelines run with the relay's own steps
//! ([`Relay::send`], [`Relay::retrying`], [`Relay::bounded`]...).

mod cursor;
mod drain;

use std::ops::Deref;

use async_trait::async_trait;
use courier_core::relay::{Relay, RelaySource, RelayStats};
use courier_core::{CancellationToken, TransportError};

pub use cursor::{CursorLease, CursorPosition, CursorSource};
pub use drain::{Drain, DrainHold, Drained};

use crate::SqlTransport;

/// A relay running one of this module's pipelines (their methods are on it; the relay's own
/// steps through `Deref`).
struct Pipe<'r>(&'r Relay);

impl Deref for Pipe<'_> {
    type Target = Relay;

    fn deref(&self) -> &Relay {
        self.0
    }
}

/// Runs `relay` over a source that drains: see [`Drain`]. What an [`SqlTransport`] on
/// PostgreSQL does as its [`RelaySource`]; exposed for other stores that can drain.
///
/// # Errors
/// As [`Relay::run`].
pub async fn relay_drained(
    relay: &Relay,
    drain: &dyn Drain,
    shutdown: &CancellationToken,
) -> Result<RelayStats, TransportError> {
    Pipe(relay).run_drained(drain, shutdown).await
}

/// Runs `relay` over a source read by a cursor: see [`CursorSource`]. What an
/// [`SqlTransport`] on PostgreSQL with `cursor=true` does as its [`RelaySource`].
///
/// # Errors
/// As [`Relay::run`].
pub async fn relay_by_cursor(
    relay: &Relay,
    cursor: &dyn CursorSource,
    shutdown: &CancellationToken,
) -> Result<RelayStats, TransportError> {
    Pipe(relay).run_cursor(cursor, shutdown).await
}

#[async_trait]
impl RelaySource for SqlTransport {
    async fn relay(
        &self,
        relay: &Relay,
        shutdown: &CancellationToken,
    ) -> Result<RelayStats, TransportError> {
        if let Some(cursor) = self.as_cursor() {
            return relay_by_cursor(relay, cursor, shutdown).await;
        }
        match self.as_drain() {
            Some(drain) => relay_drained(relay, drain, shutdown).await,
            // Not offered as a relay source (see `as_relay_source`).
            None => Err(TransportError::new(
                courier_core::TransportErrorKind::Unsupported,
                relay.source_name().to_owned(),
            )
            .with_context("this queue neither drains nor has a cursor")),
        }
    }

    fn relay_only(&self) -> bool {
        self.as_cursor().is_some()
    }
}
