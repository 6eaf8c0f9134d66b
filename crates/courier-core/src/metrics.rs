//! Metrics: what Courier emits through the [`metrics`] facade.
//!
//! Courier only *emits*: nothing is recorded until the application installs a recorder (for
//! example `metrics-exporter-prometheus`, as `courier consume --metrics ADDR` does). A library
//! never installs one. Names follow the Prometheus conventions (`_total` for counters, base units
//! in the name); the labels are what the spans of [`trace`](crate::trace) call
//! `messaging.destination.name` (`transport`) and `courier.message.type` (`message_type`).
//!
//! | Name | Kind | Labels | What |
//! |------|------|--------|------|
//! | `courier_messages_sent_total` | counter | `transport`, `message_type` | sent by the bus to a transport |
//! | `courier_messages_received_total` | counter | `transport`, `message_type` | received by a worker |
//! | `courier_messages_handled_total` | counter | `transport`, `message_type` | handled successfully |
//! | `courier_messages_failed_total` | counter | `transport`, `message_type` | failed (retried or not) |
//! | `courier_messages_retried_total` | counter | `transport`, `message_type` | put back for a retry |
//! | `courier_messages_moved_to_failure_total` | counter | `transport`, `message_type` | moved to the failure transport |
//! | `courier_handler_timeouts_total` | counter | `transport`, `message_type` | failed by a handler timeout (the handler's future dropped) |
//! | `courier_handler_duration_seconds` | histogram | `transport`, `message_type` | dispatch of a received message |
//! | `courier_ack_batch_size` | histogram | `transport` | messages per `ack_batch` |
//! | `courier_queue_depth` | gauge | `transport` | `message_count`, sampled periodically ([`spawn_queue_depth`]) |
//! | `courier_key_in_flight` | gauge | `transport`, `key` | a keyed queue's messages of a concurrency key delivered and not settled (its slots in use), sampled with the depth |
//! | `courier_key_queued` | gauge | `transport`, `key` | a keyed queue's messages of a concurrency key ready to deliver, sampled with the depth |
//! | `courier_worker_heartbeats_total` | counter | | bumped every second by each running worker |
//! | `courier_relayed_total` | counter | `from`, `to` | forwarded by a [`Relay`](crate::relay::Relay) (destination confirmed, source acked) |
//! | `courier_relay_batches_total` | counter | `from`, `to` | batches forwarded by a relay |
//! | `courier_relay_lag_seconds` | gauge | `from` | age of the oldest message still in the relay's source (an outbox's backlog), sampled by the relay |
//! | `courier_runs_total` | counter | `outcome` | durable runs executed by a worker, by outcome |
//! | `courier_run_duration_seconds` | histogram | `outcome` | one execution of a run (claim to settle) |
//! | `courier_run_requeues_total` | counter | `class` | runs requeued after a failure, by failure class |
//! | `courier_reaper_requeued_total` | counter | | stale runs requeued by the reaper |
//! | `courier_reaper_dead_lettered_total` | counter | | stale runs dead-lettered by the reaper |
//! | `courier_reaper_redispatched_total` | counter | | overdue queued runs dispatched again |
//! | `courier_lease_renewals_total` | counter | | run leases renewed at a step boundary |
//! | `courier_leases_lost_total` | counter | | runs that lost their lease |
//!
//! The queue depth is off by default: sampling it costs a query per transport, so only an
//! application that asks for it ([`spawn_queue_depth`]) pays.
//!
//! The per-key gauges keep their labels bounded however many keys a queue has: the
//! [`KEY_GAUGE_TOP`] busiest keys each get a `key` label, the rest are summed under
//! `key="other"`, and a key that leaves the top is set to 0 at the next sample.

use std::sync::Arc;
use std::time::Duration;

pub use metrics::SharedString;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::envelope::Payload;
use crate::{Envelope, Transport};

/// Messages sent by the bus to a transport (counter; `transport`, `message_type`).
pub const MESSAGES_SENT: &str = "courier_messages_sent_total";
/// Messages received by a worker (counter; `transport`, `message_type`).
pub const MESSAGES_RECEIVED: &str = "courier_messages_received_total";
/// Messages handled successfully (counter; `transport`, `message_type`).
pub const MESSAGES_HANDLED: &str = "courier_messages_handled_total";
/// Messages whose handling failed, retried or not (counter; `transport`, `message_type`).
pub const MESSAGES_FAILED: &str = "courier_messages_failed_total";
/// Failed messages put back for a retry (counter; `transport`, `message_type`).
pub const MESSAGES_RETRIED: &str = "courier_messages_retried_total";
/// Failed messages moved to the failure transport (counter; `transport`, `message_type`).
pub const MESSAGES_MOVED_TO_FAILURE: &str = "courier_messages_moved_to_failure_total";
/// Received messages whose handling ran past a handler timeout, the transport's
/// ([`WorkerBuilder::handler_timeout`](crate::WorkerBuilder::handler_timeout)) or a handler's
/// own ([`HandlerOptions::timeout`](crate::HandlerOptions::timeout)); each is also counted in
/// [`MESSAGES_FAILED`] (counter; `transport`, `message_type`).
pub const HANDLER_TIMEOUTS: &str = "courier_handler_timeouts_total";
/// How long the dispatch of a received message took (histogram, seconds).
pub const HANDLER_DURATION: &str = "courier_handler_duration_seconds";
/// Messages acked per `ack_batch` (histogram; `transport`).
pub const ACK_BATCH_SIZE: &str = "courier_ack_batch_size";
/// Messages waiting on a transport, sampled periodically (gauge; `transport`).
pub const QUEUE_DEPTH: &str = "courier_queue_depth";
/// A keyed queue's messages of one concurrency key delivered and not settled: the key's slots
/// in use (gauge; `transport`, `key`: one of the [`KEY_GAUGE_TOP`] busiest keys, or `other`).
pub const KEY_IN_FLIGHT: &str = "courier_key_in_flight";
/// A keyed queue's messages of one concurrency key ready to deliver (gauge; `transport`, `key`).
pub const KEY_QUEUED: &str = "courier_key_queued";
/// The keys of a queue that [`KEY_IN_FLIGHT`] and [`KEY_QUEUED`] label by name; the rest are
/// summed under `key="other"`.
pub const KEY_GAUGE_TOP: usize = 10;
/// The label naming a concurrency key.
pub const KEY: &str = "key";
/// Heartbeats of running workers: each bumps it every second (counter).
pub const WORKER_HEARTBEATS: &str = "courier_worker_heartbeats_total";
/// Messages forwarded by a relay (counter; `from`, `to`).
pub const RELAYED: &str = "courier_relayed_total";
/// Batches forwarded by a relay (counter; `from`, `to`).
pub const RELAY_BATCHES: &str = "courier_relay_batches_total";
/// Age of the oldest message in a relay's source, in seconds (gauge; `from`).
pub const RELAY_LAG: &str = "courier_relay_lag_seconds";
/// Durable runs executed by a worker, by outcome (counter; `outcome`).
pub const RUNS: &str = "courier_runs_total";
/// How long one execution of a durable run took (histogram, seconds; `outcome`).
pub const RUN_DURATION: &str = "courier_run_duration_seconds";
/// Runs requeued after a failure (counter; `class`: the failure class).
pub const RUN_REQUEUES: &str = "courier_run_requeues_total";
/// Stale runs requeued by the reaper (counter).
pub const REAPER_REQUEUED: &str = "courier_reaper_requeued_total";
/// Stale runs dead-lettered by the reaper (counter).
pub const REAPER_DEAD_LETTERED: &str = "courier_reaper_dead_lettered_total";
/// Overdue queued runs dispatched again by the reaper (counter).
pub const REAPER_REDISPATCHED: &str = "courier_reaper_redispatched_total";
/// Run leases renewed at a step boundary (counter).
pub const LEASE_RENEWALS: &str = "courier_lease_renewals_total";
/// Runs that lost their lease (counter).
pub const LEASES_LOST: &str = "courier_leases_lost_total";

/// The label naming the transport.
pub const TRANSPORT: &str = "transport";
/// The label naming the message type.
pub const MESSAGE_TYPE: &str = "message_type";

/// The interval of [`WORKER_HEARTBEATS`].
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Registers the description and unit of every metric with the installed recorder (optional:
/// exporters show them as `# HELP` lines). Call it after installing the recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(MESSAGES_SENT, "Messages sent by the bus to a transport");
    describe_counter!(MESSAGES_RECEIVED, "Messages received by a worker");
    describe_counter!(MESSAGES_HANDLED, "Messages handled successfully");
    describe_counter!(MESSAGES_FAILED, "Messages whose handling failed");
    describe_counter!(MESSAGES_RETRIED, "Failed messages put back for a retry");
    describe_counter!(
        MESSAGES_MOVED_TO_FAILURE,
        "Failed messages moved to the failure transport"
    );
    describe_counter!(
        HANDLER_TIMEOUTS,
        "Received messages failed by a handler timeout"
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Dispatch of a received message"
    );
    describe_histogram!(ACK_BATCH_SIZE, Unit::Count, "Messages acked per batch");
    describe_gauge!(QUEUE_DEPTH, Unit::Count, "Messages waiting on a transport");
    describe_gauge!(
        KEY_IN_FLIGHT,
        Unit::Count,
        "Messages of a concurrency key delivered and not settled (top keys, then other)"
    );
    describe_gauge!(
        KEY_QUEUED,
        Unit::Count,
        "Messages of a concurrency key ready to deliver (top keys, then other)"
    );
    describe_counter!(WORKER_HEARTBEATS, "Heartbeats of running workers (1 s)");
    describe_counter!(RELAYED, "Messages forwarded by a relay");
    describe_counter!(RELAY_BATCHES, "Batches forwarded by a relay");
    describe_gauge!(
        RELAY_LAG,
        Unit::Seconds,
        "Age of the oldest message in a relay's source"
    );
    describe_counter!(RUNS, "Durable runs executed by a worker, by outcome");
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "One execution of a durable run"
    );
    describe_counter!(RUN_REQUEUES, "Runs requeued after a failure, by class");
    describe_counter!(REAPER_REQUEUED, "Stale runs requeued by the reaper");
    describe_counter!(
        REAPER_DEAD_LETTERED,
        "Stale runs dead-lettered by the reaper"
    );
    describe_counter!(REAPER_REDISPATCHED, "Overdue queued runs dispatched again");
    describe_counter!(LEASE_RENEWALS, "Run leases renewed at a step boundary");
    describe_counter!(LEASES_LOST, "Runs that lost their lease");
}

/// The `message_type` label of an envelope: the registered (static) name, without allocating.
pub(crate) fn message_type(envelope: &Envelope) -> SharedString {
    match &envelope.payload {
        Payload::Typed { name, .. } => SharedString::const_str(name),
        Payload::Undecodable { name, .. } => {
            SharedString::from_owned(name.as_deref().unwrap_or("?").to_owned())
        }
    }
}

/// Bumps a per-message counter (`name`: one of the `MESSAGES_*` names).
pub(crate) fn message(name: &'static str, transport: &SharedString, message_type: &SharedString) {
    metrics::counter!(name, TRANSPORT => transport.clone(), MESSAGE_TYPE => message_type.clone())
        .increment(1);
}

/// Records a handler's duration.
pub(crate) fn handler_duration(
    transport: &SharedString,
    message_type: &SharedString,
    elapsed: Duration,
) {
    metrics::histogram!(HANDLER_DURATION, TRANSPORT => transport.clone(), MESSAGE_TYPE => message_type.clone())
        .record(elapsed.as_secs_f64());
}

/// Bumps [`WORKER_HEARTBEATS`] every [`HEARTBEAT_EVERY`] until aborted (a task beside the
/// worker loop, never inside its select).
pub(crate) fn spawn_heartbeat() -> JoinHandle<()> {
    tokio::spawn(async move {
        let beats = metrics::counter!(WORKER_HEARTBEATS);
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            beats.increment(1);
        }
    })
}

/// Samples `message_count` of each transport every `every` into the [`QUEUE_DEPTH`] gauge, and
/// the key loads of each keyed queue into [`KEY_IN_FLIGHT`] and [`KEY_QUEUED`], until `stop` is
/// cancelled. Off by default: only an application that calls it pays the queries (`courier
/// consume --metrics` does, every 5 s). Transports that cannot count
/// ([`Abilities::message_count`](crate::Abilities::message_count)) are skipped; a count that
/// fails is logged and skipped.
pub fn spawn_queue_depth(
    transports: Vec<(String, Arc<dyn Transport>)>,
    every: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut gauges: Vec<_> = transports
            .into_iter()
            .filter(|(_, transport)| {
                transport.as_message_count().is_some() || transport.as_keyed_queue().is_some()
            })
            .map(|(name, transport)| {
                (
                    metrics::gauge!(QUEUE_DEPTH, TRANSPORT => name.clone()),
                    KeyGauges::default(),
                    name,
                    transport,
                )
            })
            .collect();
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            for (gauge, keys, name, transport) in &mut gauges {
                if let Some(counter) = transport.as_message_count() {
                    match counter.message_count().await {
                        #[allow(clippy::cast_precision_loss)]
                        Ok(n) => gauge.set(n as f64),
                        Err(e) => {
                            tracing::debug!(messaging.destination.name = %name, error = %e, "queue depth not sampled");
                        }
                    }
                }
                if let Some(keyed) = transport.as_keyed_queue() {
                    match keyed.key_loads(KEY_GAUGE_TOP).await {
                        Ok(loads) => keys.set(name, &loads),
                        Err(e) => {
                            tracing::debug!(messaging.destination.name = %name, error = %e, "key loads not sampled");
                        }
                    }
                }
            }
        }
    })
}

/// The per-key gauges of one transport: the keys labelled at the last sample, so that a key
/// that leaves the top is set to 0 once (and then forgotten: the labels stay bounded).
#[derive(Default)]
struct KeyGauges {
    labelled: std::collections::BTreeSet<String>,
}

impl KeyGauges {
    #[allow(clippy::cast_precision_loss)]
    fn set(&mut self, transport: &str, loads: &crate::KeyLoads) {
        let set = |key: &str, in_flight: u64, queued: u64| {
            let labels = [(TRANSPORT, transport.to_owned()), (KEY, key.to_owned())];
            metrics::gauge!(KEY_IN_FLIGHT, &labels).set(in_flight as f64);
            metrics::gauge!(KEY_QUEUED, &labels).set(queued as f64);
        };
        let mut now = std::collections::BTreeSet::new();
        for load in loads.keys.iter().chain(&loads.other) {
            set(&load.key, load.in_flight, load.queued);
            now.insert(load.key.clone());
        }
        for gone in self.labelled.difference(&now) {
            set(gone, 0, 0);
        }
        self.labelled = now;
    }
}
