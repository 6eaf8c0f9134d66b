//! Taking messages out of a queue under a transaction: what a relay reads an outbox with
//! where the store can ([`Transport::as_drain`](crate::Transport::as_drain): SQL on
//! PostgreSQL).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::{Envelope, TransportError};

/// Takes messages out of a queue for good in one step, held back until committed: a
/// PostgreSQL `DELETE ... RETURNING` of rows locked `FOR UPDATE SKIP LOCKED`, in a transaction
/// left open until [`Drained::commit`]. Other consumers skip the held rows; dropping the batch
/// (or the process dying) rolls the transaction back and puts every row back where it was.
///
/// Beside `get` then `ack_batch`, this writes each row once (a delete) instead of twice (the
/// claim's update, then the delete), and a crashed holder's rows come back at once rather than
/// after the redelivery window. The price: a batch held for long keeps its transaction open,
/// which on PostgreSQL holds back vacuum. The relay holds one at most
/// [`RelayOptions::hold_limit`](crate::relay::RelayOptions::hold_limit) while its destination
/// refuses it, then drops the hold; a server that ends the transaction only makes its messages
/// come back to be relayed again.
///
/// A holder cut off from the store (a network partition, a host that froze) cannot roll back,
/// and the store may not notice for hours (PostgreSQL waits for TCP keepalives, two hours by
/// default): each drain says how long its batch may stay held (`hold_for`), and the store ends
/// the hold on its own side past it (PostgreSQL: `idle_in_transaction_session_timeout` on the
/// drain's transaction), so the messages come back to another relay within that bound.
///
/// Drains may overlap without giving up the queue's order: each tells `held` as soon as its
/// rows are locked, before it reads them back, and a drain started after that skips them and
/// takes the messages behind them. A relay starts its next drain at that signal, so the
/// slower half of one drain (the delete, reading the rows back, decoding them) runs beside the
/// next.
#[async_trait]
pub trait Drain: Send + Sync {
    /// Takes up to `max` messages in the order `get` hands them out, waiting up to the
    /// transport's poll window for the first; an empty batch when none came. Calls
    /// `held.notify_one()` once the batch's messages are locked, before they are read back (a
    /// drain started after that takes the messages behind them); never for an empty batch,
    /// whose drain may still be waiting for the first message: start the next one when it
    /// returns. The batch stays held at most `hold_for` while its holder is silent: past it
    /// the store may end the hold (the messages come back and a later commit fails).
    async fn drain(
        &self,
        max: usize,
        hold_for: Duration,
        held: &Notify,
    ) -> Result<Drained, TransportError>;
}

/// What holds a drained batch back: committing removes its messages for good.
#[async_trait]
pub trait DrainHold: Send {
    /// Removes the held messages for good (commits the transaction).
    async fn commit(self: Box<Self>) -> Result<(), TransportError>;
}

/// A batch taken by [`Drain::drain`]: its messages, and the hold on them.
pub struct Drained {
    /// The messages, in queue order.
    pub envelopes: Vec<Envelope>,
    hold: Option<Box<dyn DrainHold>>,
}

impl Drained {
    /// A batch whose messages stay held by `hold` until [`commit`](Self::commit).
    #[must_use]
    pub fn new(envelopes: Vec<Envelope>, hold: Box<dyn DrainHold>) -> Self {
        Self {
            envelopes,
            hold: Some(hold),
        }
    }

    /// An empty batch, holding nothing.
    #[must_use]
    pub fn empty() -> Self {
        Self {
            envelopes: Vec::new(),
            hold: None,
        }
    }

    /// Whether the batch has no messages.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// Removes the batch's messages for good. On an error the hold is gone too (a broken
    /// connection rolled the transaction back): the messages are back in the queue.
    ///
    /// # Errors
    /// The store's, when the commit failed.
    pub async fn commit(mut self) -> Result<(), TransportError> {
        match self.hold.take() {
            Some(hold) => hold.commit().await,
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Drained {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drained")
            .field("envelopes", &self.envelopes.len())
            .field("held", &self.hold.is_some())
            .finish()
    }
}
