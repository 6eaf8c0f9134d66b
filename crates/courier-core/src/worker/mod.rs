//! The worker: consumes transports and dispatches what it receives on the bus (`courier consume`).
//!
//! Per message: add [`ReceivedStamp`](crate::ReceivedStamp) -> dispatch on the bus named by its
//! [`BusNameStamp`](crate::BusNameStamp) -> ack on success. Acks of one fetched batch are flushed
//! together with [`Transport::ack_batch`] when the batch is done or after a short linger (batches
//! of fewer than 16 gather their acks across fetches while the next fetch is under way and the
//! last found a backlog, up to 16 or the linger), so a crash between handling and the flush means redelivery, never loss. On failure the worker adds
//! an [`ErrorDetailsStamp`](crate::ErrorDetailsStamp) and asks the receiver's
//! [`RetryStrategy`]: retry (with [`RedeliveryStamp`](crate::RedeliveryStamp) and a delay, through
//! [`Transport::retry`]) or move to the failure transport (with
//! [`SentToFailureTransportStamp`](crate::SentToFailureTransportStamp)) and only then ack. If that
//! move fails the original is not acked: **nothing is ever dropped**. A message that does not
//! decode goes to the failure transport the same way; without a failure transport, failed
//! messages stay on their transport for redelivery.

mod ack;
mod beside;
mod events;
mod fetch;
mod hooks;
mod io;
mod process;
mod registry;
mod run;
mod state;

pub(crate) use io::AbortOnDrop;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use events::{Listener, StopReason, WorkerEvent, WorkerStats};
pub use hooks::{Received, ReceivedHook, Skip};
pub use registry::{DEFAULT_REGISTRY_HEARTBEAT, UNREGISTER_TIMEOUT, default_worker_id, host_name};
pub use tokio_util::sync::CancellationToken;

use crate::retry::{MultiplierRetryStrategy, RetryStrategy};
use crate::{MessageBus, Transport};

/// A transport the worker consumes, with its retry strategy and failure transport.
#[derive(Debug, Clone)]
pub(crate) struct Receiver {
    pub(crate) name: String,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) retry: Arc<dyn RetryStrategy>,
    pub(crate) failure: Option<(String, Arc<dyn Transport>)>,
    /// How long the handling of one of its messages may take ([`WorkerBuilder::handler_timeout`]).
    pub(crate) handler_timeout: Option<Duration>,
    /// Its [`ReceivedStamp`](crate::ReceivedStamp), shared by every envelope it receives.
    pub(crate) received: Arc<dyn crate::stamp::AnyStamp>,
    /// Its name as a metrics label (shared, so labelling a message does not allocate).
    pub(crate) label: crate::metrics::SharedString,
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// No receiver was configured.
    #[error("the worker has no transport to consume")]
    NoReceivers,
    /// An option is out of range.
    #[error("invalid worker option `{option}`: {reason}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Consumes transports until a limit is reached or shutdown is requested.
///
/// Built with [`Worker::builder`]; see the [module docs](self) for the per-message behaviour and
/// the crate docs for an example.
pub struct Worker {
    pub(crate) buses: HashMap<String, MessageBus>,
    pub(crate) default_bus: MessageBus,
    pub(crate) receivers: Vec<Receiver>,
    pub(crate) options: WorkerOptions,
    pub(crate) listeners: Vec<Listener>,
    pub(crate) on_received: Vec<ReceivedHook>,
    /// Every message goes to this bus, whatever its `BusNameStamp` says (`consume --bus`).
    pub(crate) forced_bus: Option<MessageBus>,
    /// Where the worker registers itself, if anywhere ([`WorkerBuilder::registry`]).
    pub(crate) registration: Option<Arc<registry::Registration>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field(
                "receivers",
                &self.receivers.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct WorkerOptions {
    pub(crate) fetch_size: usize,
    pub(crate) concurrency: usize,
    pub(crate) limit: Option<u64>,
    pub(crate) failure_limit: Option<u64>,
    pub(crate) time_limit: Option<Duration>,
    pub(crate) memory_limit: Option<u64>,
    pub(crate) sleep: Duration,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) grace: Duration,
    pub(crate) ack_linger: Duration,
    /// Whether a task bumps the heartbeat metric every second; off under
    /// [`crate::testing::run_until_empty`], where a second-by-second tick would be most of the
    /// work of running through days of tokio's paused clock.
    pub(crate) heartbeat_metric: bool,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            fetch_size: 32,
            concurrency: 1,
            limit: None,
            failure_limit: None,
            time_limit: None,
            memory_limit: None,
            sleep: Duration::from_secs(1),
            keepalive: None,
            grace: Duration::from_secs(30),
            ack_linger: Duration::from_millis(5),
            heartbeat_metric: true,
        }
    }
}

impl Worker {
    /// Starts building a worker that dispatches on `bus` (and on the buses added with
    /// [`WorkerBuilder::bus`], chosen by each message's `BusNameStamp`).
    #[must_use]
    pub fn builder(bus: MessageBus) -> WorkerBuilder {
        WorkerBuilder {
            worker: Worker {
                buses: HashMap::new(),
                default_bus: bus,
                receivers: Vec::new(),
                options: WorkerOptions::default(),
                listeners: Vec::new(),
                on_received: Vec::new(),
                forced_bus: None,
                registration: None,
            },
            global_failure: None,
        }
    }
}

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    worker: Worker,
    global_failure: Option<(String, Arc<dyn Transport>)>,
}

impl WorkerBuilder {
    /// Adds a transport to consume; receivers are polled in the order added (the first has the
    /// highest priority: after each batch the worker starts again from the first).
    #[must_use]
    pub fn receiver(mut self, name: impl Into<String>, transport: Arc<dyn Transport>) -> Self {
        let name: String = name.into();
        self.worker.receivers.push(Receiver {
            received: Arc::new(crate::ReceivedStamp(name.clone())),
            label: crate::metrics::SharedString::from(Arc::<str>::from(name.as_str())),
            name,
            transport,
            retry: Arc::new(MultiplierRetryStrategy::default()),
            failure: None,
            handler_timeout: None,
        });
        self
    }

    /// Sets the retry strategy of the receiver added last.
    #[must_use]
    pub fn retry_strategy(mut self, strategy: Arc<dyn RetryStrategy>) -> Self {
        if let Some(r) = self.worker.receivers.last_mut() {
            r.retry = strategy;
        }
        self
    }

    /// How long the handling of one message of the receiver added last may take (default
    /// `None`: no limit, as in Symfony; `[transports.NAME] handler_timeout` in configuration).
    ///
    /// A hung handler would otherwise hold its message (kept alive by the keepalive) and its
    /// slot of [`WorkerBuilder::concurrency`] forever. Past the timeout the dispatch's future
    /// is dropped (middleware and handlers stop at their next `.await`; blocking code on the
    /// thread is not interrupted), a warning is logged, `courier_handler_timeouts_total` is
    /// bumped, and the message fails with [`BusError::Timeout`](crate::BusError::Timeout),
    /// class `timeout`: the retry strategy decides between a retry and the failure transport,
    /// where the [`ErrorDetailsStamp`](crate::ErrorDetailsStamp) names the class and the
    /// timeout. Handlers that finished before it are run again on the retry (their
    /// [`HandledStamp`](crate::HandledStamp)s went with the dropped future); a handler's own
    /// [`HandlerOptions::timeout`](crate::HandlerOptions::timeout) keeps them. A message in
    /// flight for a batch handler stops waiting, but its batch runs on.
    ///
    /// A durable run's `RunAgent` message is handled by executing the run: a timeout shorter
    /// than a run abandons it like a crashed worker would (the reaper requeues it once its
    /// lease runs out).
    #[must_use]
    pub fn handler_timeout(mut self, timeout: Option<Duration>) -> Self {
        if let Some(r) = self.worker.receivers.last_mut() {
            r.handler_timeout = timeout;
        }
        self
    }

    /// Sets the failure transport of the receiver added last.
    #[must_use]
    pub fn failure_transport(
        mut self,
        name: impl Into<String>,
        transport: Arc<dyn Transport>,
    ) -> Self {
        if let Some(r) = self.worker.receivers.last_mut() {
            r.failure = Some((name.into(), transport));
        }
        self
    }

    /// Sets the failure transport of every receiver that has none of its own.
    #[must_use]
    pub fn global_failure_transport(
        mut self,
        name: impl Into<String>,
        transport: Arc<dyn Transport>,
    ) -> Self {
        self.global_failure = Some((name.into(), transport));
        self
    }

    /// Adds a bus the worker dispatches to when a message's `BusNameStamp` names it.
    #[must_use]
    pub fn bus(mut self, bus: MessageBus) -> Self {
        self.worker.buses.insert(bus.name().to_owned(), bus);
        self
    }

    /// Dispatches every received message to `bus`, whatever bus its `BusNameStamp` names
    /// (Messenger's `messenger:consume --bus`).
    #[must_use]
    pub fn dispatch_to(mut self, bus: MessageBus) -> Self {
        self.worker.forced_bus = Some(bus);
        self
    }

    /// Messages fetched per `get` (default 32).
    #[must_use]
    pub fn fetch_size(mut self, n: usize) -> Self {
        self.worker.options.fetch_size = n.max(1);
        self
    }

    /// Handlers running at once (default 1).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.worker.options.concurrency = n.max(1);
        self
    }

    /// Stop after this many messages were received and processed.
    #[must_use]
    pub fn limit(mut self, n: u64) -> Self {
        self.worker.options.limit = Some(n);
        self
    }

    /// Stop after this many messages failed.
    #[must_use]
    pub fn failure_limit(mut self, n: u64) -> Self {
        self.worker.options.failure_limit = Some(n);
        self
    }

    /// Stop after running this long.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.worker.options.time_limit = Some(limit);
        self
    }

    /// Stop when the process's resident memory exceeds this many bytes (checked between messages).
    #[must_use]
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.worker.options.memory_limit = Some(bytes);
        self
    }

    /// How long to wait when no transport had a message (default 1 s; skipped when every
    /// transport's `get` blocks by itself).
    #[must_use]
    pub fn sleep(mut self, sleep: Duration) -> Self {
        self.worker.options.sleep = sleep;
        self
    }

    /// Calls `keepalive` on every message the worker holds, started or not, at this interval.
    /// Default (`None`): a third of the shortest redelivery window among the receivers
    /// ([`Capabilities::redeliver_after`](crate::Capabilities::redeliver_after)), so a live
    /// worker's messages are never delivered twice and a dead worker's come back within it.
    #[must_use]
    pub fn keepalive(mut self, interval: Option<Duration>) -> Self {
        self.worker.options.keepalive = interval;
        self
    }

    /// How long in-flight handlers may run after shutdown was requested (default 30 s); past it
    /// they are abandoned un-acked, for redelivery.
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.worker.options.grace = grace;
        self
    }

    /// How long a successful message may wait for its batch's ack flush (default 5 ms). A batch
    /// of fewer than 16 messages done while the next fetch is under way, the last one having
    /// come back within a millisecond (`fetch_size(1)` under a backlog), keeps its acks
    /// gathering with the next batches' until 16 are due or this has passed: one ack statement
    /// for many fetches.
    #[must_use]
    pub fn ack_linger(mut self, linger: Duration) -> Self {
        self.worker.options.ack_linger = linger;
        self
    }

    /// Registers the worker in `registry` as `record` while it runs (see
    /// [`crate::WorkerRegistry`]): registered at start, a heartbeat with its handled
    /// and failed counts every [`WorkerBuilder::registry_heartbeat`] on a task beside the loop,
    /// unregistered when [`Worker::run`] returns. A heartbeat that says a stop was requested
    /// (`courier stop-workers`) stops the worker like its shutdown token. A store that fails is
    /// logged and tried again at the next heartbeat; it never stops the worker.
    #[must_use]
    pub fn registry(
        mut self,
        registry: Arc<dyn crate::WorkerRegistry>,
        record: crate::WorkerRecord,
    ) -> Self {
        let heartbeat = self.worker.registration.as_ref().and_then(|r| r.heartbeat);
        self.worker.registration = Some(Arc::new(registry::Registration {
            registry,
            record,
            heartbeat,
            counts: Arc::default(),
        }));
        self
    }

    /// How often the worker heartbeats in its registry (default
    /// [`DEFAULT_REGISTRY_HEARTBEAT`], 2 s; never more than a third of the registry's
    /// `stale_after`). Call after [`WorkerBuilder::registry`].
    #[must_use]
    pub fn registry_heartbeat(mut self, every: Duration) -> Self {
        if let Some(r) = self.worker.registration.as_mut() {
            Arc::make_mut(r).heartbeat = Some(every);
        }
        self
    }

    /// Adds an event listener.
    #[must_use]
    pub fn listener(mut self, listener: impl Fn(&WorkerEvent) + Send + Sync + 'static) -> Self {
        self.worker.listeners.push(Arc::new(listener));
        self
    }

    /// Adds a hook that sees every received message before it is handled and may add stamps,
    /// skip it (ack or reject without handling) or stop the worker after it (see [`Received`]).
    /// Hooks run in the order added; a message that does not decode skips them (it goes to the
    /// failure transport).
    #[must_use]
    pub fn on_received(mut self, hook: impl Fn(&mut Received<'_>) + Send + Sync + 'static) -> Self {
        self.worker.on_received.push(Arc::new(hook));
        self
    }

    /// Builds the worker.
    #[must_use]
    pub fn build(mut self) -> Worker {
        if let Some(global) = self.global_failure {
            for r in &mut self.worker.receivers {
                if r.failure.is_none() {
                    r.failure = Some(global.clone());
                }
            }
        }
        let default = self.worker.default_bus.clone();
        self.worker
            .buses
            .entry(default.name().to_owned())
            .or_insert(default);
        self.worker
    }
}
