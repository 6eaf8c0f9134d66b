//! The core of [Courier](https://docs.rs/courier): envelopes and stamps, the message bus and its
//! middleware, routing, the [`Transport`] contract with the `sync://` and `in-memory://`
//! transports, retry strategies, the [`Worker`], and configuration.
//!
//! ```
//! use courier_core::{HandlerError, InMemoryTransport, Message, MessageBus, Worker};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Welcome { user: String }
//! impl Message for Welcome { const NAME: &'static str = "mail.welcome"; }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let sent = Arc::new(AtomicUsize::new(0));
//! let counter = sent.clone();
//! let queue = Arc::new(InMemoryTransport::new());
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("mail.*", ["async"])
//!     .handler_fn("send_welcome", move |m: Arc<Welcome>| {
//!         let counter = counter.clone();
//!         async move {
//!             assert_eq!(m.user, "ada");
//!             counter.fetch_add(1, Ordering::SeqCst);
//!             Ok::<(), HandlerError>(())
//!         }
//!     })
//!     .build();
//!
//! bus.dispatch(Welcome { user: "ada".into() }).await?;     // queued on "async"
//!
//! let stats = Worker::builder(bus).receiver("async", queue.clone()).limit(1).build()
//!     .run(Default::default()).await?;                    // consumes it
//! assert_eq!(sent.load(Ordering::SeqCst), 1);
//! assert_eq!(stats.handled, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

mod backoff;
mod bus;
mod codec;
pub mod config;
mod dsn;
mod envelope;
mod error;
pub mod failed;
mod message;
pub mod metrics;
pub mod relay;
pub mod retry;
pub mod schedule;
pub mod signing;
mod stamp;
pub mod testing;
pub mod trace;
mod transport;
pub mod worker;

pub use backoff::{Attempts, Backoff, Jitter};
pub use bus::{
    BatchHandler, BatchItem, BatchOptions, BusError, BusLink, DEFAULT_BUS, Dispatcher,
    HandledResultStamp, Handler, HandlerFailure, HandlerOptions, MessageBus, MessageBusBuilder,
    Middleware, Next, Prepared, QueryError, QueryHandler, Router, SendHook, Sending,
    with_trace_context,
};
pub use codec::{
    BASE64_ENCODING, BODY_ENCODING_HEADER, CONTENT_TYPE_HEADER, DecodeError, EncodeError, Encoded,
    EncodedJson, HeaderPair, JSON_CONTENT_TYPE, JsonDecoder, MSGPACK_CONTENT_TYPE, MessageRegistry,
    RAW_HEADERS_BASE64_HEADER, RAW_HEADERS_HEADER, STAMP_HEADER_PREFIX, Serializer, TYPE_HEADER,
    UnknownSerializer, encode, encode_json, encode_json_into, encode_json_into_with,
    encode_json_with, encode_with, header_pairs,
};
pub use dsn::{Dsn, DsnError, redact};
pub use envelope::Envelope;
pub use error::{
    BoxError, ErrorChain, HandlerError, HandlerResultExt, HandlerTimeout, TransportError,
    TransportErrorKind, error_chain,
};
pub use failed::{rfc3339, rfc3339_ms};
pub use message::Message;
pub use retry::{MultiplierRetryStrategy, RetryDecision, RetryStrategy};
pub use schedule::{
    InMemoryScheduleStore, Missed, Schedule, ScheduleState, ScheduleStore, Scheduler, Trigger,
    shared_schedule_store,
};
pub use signing::{SignatureStamp, Signing, SigningKeys};
pub use stamp::*;
pub use trace::{PropagatorAlreadySet, TracePropagator, set_trace_propagator};
pub use transport::{
    Abilities, Capabilities, DEFAULT_WORKER_STALE_AFTER, Deduplicate, FactoryContext, Heartbeat,
    InMemoryOptions, InMemoryTransport, InMemoryWorkerRegistry, KeyedQueue, Listable,
    MemoryDeduplicator, MemoryRateLimiter, MessageCount, NO_ANSWER_AFTER, PAUSE_CHECK, Pausable,
    PauseGate, Queues, RateLimit, RateLimitGate, RateLimiter, Setup, SyncTransport, Taken,
    Transport, TransportFactory, TransportRegistry, WorkerRecord, WorkerRegistry, retry_count,
    shared_worker_registry,
};
pub use worker::{
    CancellationToken, StopReason, Worker, WorkerBuilder, WorkerError, WorkerEvent, WorkerStats,
};

/// Re-exported for implementing [`Transport`], [`Handler`] and [`Middleware`].
pub use async_trait::async_trait;
