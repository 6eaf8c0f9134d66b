//! The pause flag a transport keeps in its server (see [`PauseGate`](super::PauseGate)).

use async_trait::async_trait;

use crate::TransportError;

/// A transport whose queue can be paused, the flag shared through its server.
#[async_trait]
pub trait Pausable: Send + Sync {
    /// Sets (`true`) or clears the pause flag of this transport's queue; returns whether it
    /// changed.
    async fn set_paused(&self, paused: bool) -> Result<bool, TransportError>;

    /// Whether this transport's queue is paused.
    async fn is_paused(&self) -> Result<bool, TransportError>;
}
