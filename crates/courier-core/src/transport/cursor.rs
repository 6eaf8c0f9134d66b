//! Reading a queue by a cursor: what a relay reads a cursor outbox with
//! ([`Transport::as_cursor`](crate::Transport::as_cursor): SQL on PostgreSQL with
//! `cursor=true`).

use std::time::Duration;

use async_trait::async_trait;

use crate::{Envelope, TransportError};

/// Where a cursor stands in its source: just after the last message read (or relayed), in the
/// source's own order. Opaque to the relay, which only hands positions back; the default
/// stands before every message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CursorPosition {
    /// The major part of the order (PostgreSQL: the id of the transaction that wrote the
    /// message).
    pub major: i64,
    /// The minor part (PostgreSQL: the row's id).
    pub minor: i64,
}

/// A queue read by a cursor rather than taken message by message: reading writes nothing, and
/// the messages a relay forwarded are removed in bulk when it moves the cursor past them. The
/// cheapest way out of an outbox: [`Drain`](crate::Drain) locks and deletes each row (two
/// writes of every row), [`get`](crate::Transport::get) then `ack_batch` claims and deletes
/// (two writes and two statements); a cursor reads each row once and deletes a range.
///
/// One reader at a time: the cursor is held under a [`CursorLease`]. A second relay waits
/// until the first lets go of it: at once when the first dies (PostgreSQL: the lease is a lock
/// of the holder's session, which ends with its process), within the lease when the first is
/// cut off from the source. It then goes on from where the cursor stands: whatever the first
/// had sent past it is sent again (at least once).
///
/// The order is the source's own and the same for every reader (PostgreSQL: the order of the
/// writing transactions' ids, then of the rows within one); a message is read only once no
/// message can appear before it any more (PostgreSQL: once every transaction that began
/// before it ended), so a reader never skips one that commits late.
#[async_trait]
pub trait CursorSource: Send + Sync {
    /// Takes the cursor for `owner` (a name for operators), to be held while the holder
    /// answers within `lease`; `None` while another holds it.
    async fn acquire(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Box<dyn CursorLease>>, TransportError>;

    /// Up to `max` messages after `after`, in the source's order, waiting up to the
    /// transport's poll window for the first; with the position just after the last (`after`
    /// itself when there are none). Reading moves nothing: read again from the same position,
    /// the same messages come back. A message stored with a delay still to run comes with a
    /// [`DelayStamp`](crate::DelayStamp) of what is left of it (its destination serves it); one
    /// whose delay ran out comes without one.
    async fn read(
        &self,
        after: CursorPosition,
        max: usize,
    ) -> Result<(Vec<Envelope>, CursorPosition), TransportError>;
}

/// A held cursor (see [`CursorSource::acquire`]). Dropping it lets the cursor go.
#[async_trait]
pub trait CursorLease: Send {
    /// Where the cursor stood when it was taken.
    fn position(&self) -> CursorPosition;

    /// Moves the cursor to `to` and removes every message up to it for good. An error may mean
    /// the lease is gone (its session ended): drop this lease and take the cursor again, from
    /// where it stands.
    async fn advance(&mut self, to: CursorPosition) -> Result<(), TransportError>;

    /// Tells the source the holder is alive, so that the lease does not run out while it has
    /// nothing to move (call it well within the lease). An error: as for
    /// [`advance`](Self::advance).
    async fn renew(&mut self) -> Result<(), TransportError>;
}
