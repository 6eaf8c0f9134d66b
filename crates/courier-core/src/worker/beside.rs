//! The tasks beside the loop: the ack flushers, the keepalive, the heartbeat metric and the
//! releases of unstarted messages; started with the loop and finished after it.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::io::{self, AbortOnDrop, AckStats, Acker, Held};
use super::state::RunState;
use super::{Worker, WorkerEvent};
use crate::Envelope;

/// How long a stopping worker may take past its grace period to flush acks and release
/// unstarted messages, whatever the servers do.
pub(super) const SHUTDOWN_SLACK: Duration = Duration::from_secs(1);

/// The shortest keepalive interval derived from a transport's redelivery window.
const MIN_KEEPALIVE: Duration = Duration::from_millis(50);

/// The tasks beside the loop.
pub(super) struct Beside {
    pub(super) held: Arc<Held>,
    pub(super) ackers: Vec<Acker>,
    ack_tasks: Vec<JoinHandle<AckStats>>,
    keepalive: Option<AbortOnDrop<()>>,
    /// Bumps the heartbeat metric every second, beside the loop (not under
    /// [`crate::testing::run_until_empty`]).
    heartbeat: Option<AbortOnDrop<()>>,
    releases: Vec<JoinHandle<u64>>,
}

impl Worker {
    pub(super) fn start_beside(&self) -> Beside {
        let keepalive = self.keepalive_interval();
        // Envelopes are kept for the keepalive, and for listeners (what is left is named);
        // otherwise the set only counts.
        let held = Arc::new(Held::new(keepalive.is_some() || !self.listeners.is_empty()));
        let max_batch = self.options.fetch_size.saturating_mul(2).max(1);
        let (ackers, ack_tasks) = self
            .receivers
            .iter()
            .map(|r| {
                io::spawn_acker(
                    r.name.clone(),
                    r.transport.clone(),
                    held.clone(),
                    self.listeners.clone(),
                    max_batch,
                )
            })
            .unzip();
        let keepalive = keepalive.map(|interval| {
            let receivers = self
                .receivers
                .iter()
                .map(|r| (r.name.clone(), r.transport.clone()))
                .collect();
            AbortOnDrop(io::spawn_keepalive(receivers, held.clone(), interval))
        });
        Beside {
            held,
            ackers,
            ack_tasks,
            keepalive,
            heartbeat: self
                .options
                .heartbeat_metric
                .then(|| AbortOnDrop(crate::metrics::spawn_heartbeat())),
            releases: Vec::new(),
        }
    }

    /// The keepalive interval: the one configured, else a third of the shortest redelivery
    /// window among the receivers (none when no receiver has one).
    pub(super) fn keepalive_interval(&self) -> Option<Duration> {
        self.options.keepalive.or_else(|| {
            self.receivers
                .iter()
                .filter_map(|r| r.transport.capabilities().redeliver_after)
                .min()
                .map(|window| (window / 3).max(MIN_KEEPALIVE))
        })
    }

    /// Puts unstarted messages back on their transports, on tasks beside the loop.
    pub(super) fn release(&self, beside: &mut Beside, messages: Vec<(usize, u64, Envelope)>) {
        let mut by_receiver: Vec<Vec<(u64, Envelope)>> = vec![Vec::new(); self.receivers.len()];
        for (r, key, envelope) in messages {
            by_receiver[r].push((key, envelope));
        }
        for (receiver, messages) in self.receivers.iter().zip(by_receiver) {
            if messages.is_empty() {
                continue;
            }
            beside.releases.push(io::spawn_release(
                receiver.name.clone(),
                receiver.transport.clone(),
                beside.held.clone(),
                messages,
            ));
        }
    }

    /// Flushes the last acks and waits for the releases, until the grace period has passed
    /// since the stop and one second more; what is still held then is left for redelivery.
    pub(super) async fn finish(&self, beside: Beside, stopped_at: Instant, state: &mut RunState) {
        let Beside {
            held,
            ackers,
            ack_tasks,
            keepalive,
            heartbeat,
            releases,
        } = beside;
        drop(heartbeat);
        drop(ackers);
        let deadline = (stopped_at + self.options.grace).max(Instant::now()) + SHUTDOWN_SLACK;
        for task in ack_tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(stats)) => state.stats.left_for_redelivery += stats.failed,
                Ok(Err(_)) => {}
                Err(_) => {
                    abort.abort();
                    tracing::warn!(
                        "ack flush did not finish in time; the messages will be redelivered"
                    );
                }
            }
        }
        for task in releases {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(released)) => state.stats.released += released,
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        drop(keepalive);
        let left = held.drain();
        if !left.is_empty() {
            tracing::warn!(
                count = left.len(),
                "stopping with unsettled messages; they will be redelivered"
            );
        }
        state.stats.left_for_redelivery += left.len() as u64;
        for (r, envelope) in left {
            self.emit_with(|| WorkerEvent::LeftForRedelivery {
                transport: self.receivers[r].name.clone(),
                id: envelope.as_ref().and_then(Envelope::id).map(str::to_owned),
                reason: "not settled when the worker stopped".into(),
            });
        }
    }
}
