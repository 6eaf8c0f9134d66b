//! The state of the reading side of a Redis transport: its dedicated connection, the
//! consumer group, and when it next claims, promotes and reaps.

use tokio::time::Instant;

use crate::link::Link;

/// The state of the reading side; one `get` at a time uses it.
pub(crate) struct Reader {
    pub(crate) link: Link,
    pub(crate) generation: u64,
    pub(crate) group_ready: bool,
    pub(crate) recover: bool,
    pub(crate) cursor: String,
    pub(crate) next_claim: Instant,
    pub(crate) next_due: Option<Instant>,
    pub(crate) next_promote: Instant,
    pub(crate) failures: u32,
    /// A read was sent and its reply not taken yet. Still set when the next `get` starts, the
    /// last one was dropped on the way (its worker stopped, its fetch was cut off): a blocking
    /// `XREADGROUP` it left on the server may have delivered entries to this consumer that
    /// nobody holds, so they are taken back first rather than after the redelivery window.
    pub(crate) reading: bool,
}

impl Reader {
    /// The reading side's connection.
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    pub(crate) fn new(link: Link) -> Self {
        Self {
            link,
            generation: 0,
            group_ready: false,
            recover: true,
            cursor: "0-0".to_owned(),
            next_claim: Instant::now(),
            next_due: None,
            next_promote: Instant::now(),
            failures: 0,
            reading: false,
        }
    }
}
