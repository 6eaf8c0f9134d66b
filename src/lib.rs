//! # Courier
//!
//! Message transports for Rust in the spirit of Symfony Messenger, with a durable run layer on
//! top. Dispatch typed messages on a [`MessageBus`]; route them to transports chosen by a DSN
//! (`sync://`, `in-memory://`, `sqlite://`, `postgres://`, `mysql://`, `redis://`, `amqp://`, `nats://`);
//! consume them with a [`Worker`] that retries with backoff, moves what keeps failing to a
//! failure transport, and shuts down gracefully. Unit-test with the in-memory or sync transport.
//!
//! ```
//! use courier::{CancellationToken, HandlerError, InMemoryTransport, Message, MessageBus, Worker};
//! use serde::{Deserialize, Serialize};
//! use std::sync::Arc;
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendInvoice { invoice_id: u64 }
//!
//! impl Message for SendInvoice {
//!     const NAME: &'static str = "billing.send_invoice"; // the stable wire name
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let queue = Arc::new(InMemoryTransport::new());
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("billing.*", ["async"])
//!     .handler_fn("send_invoice", |m: Arc<SendInvoice>| async move {
//!         println!("sending invoice {}", m.invoice_id);
//!         Ok::<(), HandlerError>(())
//!     })
//!     .build();
//!
//! bus.dispatch(SendInvoice { invoice_id: 42 }).await?;
//! let stats = Worker::builder(bus).receiver("async", queue).limit(1).build()
//!     .run(CancellationToken::new()).await?;
//! assert_eq!(stats.handled, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! ## Crate features
//!
//! | feature | what it adds |
//! |---|---|
//! | `sql` + `sqlite` (default) | [`sql::SqlTransport`] on SQLite, the embedded default |
//! | `postgres`, `mysql` | the SQL transport on PostgreSQL and MySQL / MariaDB |
//! | `redis` | `redis::RedisTransport` (Redis Streams) |
//! | `amqp` | `amqp::AmqpTransport` (RabbitMQ) |
//! | `nats` | `nats::NatsTransport` (NATS JetStream) |
//! | `runs` (default) | [`runs`]: durable runs under a lease, heartbeat, reaper, retry per failure class |
//! | `otel` | `otel` (`courier-otel`): OpenTelemetry spans and W3C trace context across transports, an OTLP exporter |
//! | `agent` | `agent` (`courier-agent`): an OpenAI-compatible tool-calling agent on durable steps, with provider fallback and shared circuit breakers (reqwest, rustls on ring) |
//! | `symfony` | `symfony` (`courier-symfony`): Symfony Messenger interop (its serializers and, with `sqlite`, `postgres` or `mysql`, its Doctrine table: `symfony+postgres://`, `symfony+sqlite://`, `symfony+mysql://`; with `redis`, its Redis transport: `symfony+redis://`; with `amqp`, its AMQP layout: `symfony+amqp://`) |
//! | `full` | everything |
//!
//! The defaults are a library: no command line, no web server, no allocator, and tokio gets only
//! the features Courier uses (the runtime is the application's). The `courier` command line is
//! the `courier-cli` package (`cargo install courier-cli`); an application that wants its own
//! binary with its handlers depends on `courier-cli` as a library (`courier_cli::App`).

pub use courier_core::*;

// The README's and the book's Rust blocks as doctests (`cargo test --doc --all-features`).
#[cfg(all(doctest, feature = "full"))]
mod doctests;

#[cfg(feature = "agent")]
pub use courier_agent as agent;
#[cfg(feature = "amqp")]
pub use courier_amqp as amqp;
#[cfg(feature = "nats")]
pub use courier_nats as nats;
#[cfg(feature = "otel")]
pub use courier_otel as otel;
#[cfg(feature = "redis")]
pub use courier_redis as redis;
#[cfg(feature = "runs")]
pub use courier_runs as runs;
#[cfg(feature = "sql")]
pub use courier_sql as sql;
#[cfg(feature = "symfony")]
pub use courier_symfony as symfony;

/// A [`TransportRegistry`] with every transport this build enables: `sync://`, `in-memory://`
/// and, by feature, the SQL, Redis, AMQP and NATS schemes, and Symfony's Doctrine table and
/// Redis and AMQP transports (`symfony+postgres://`, `symfony+redis://`, `symfony+amqp://`, ...; its factory maps no PHP class: register
/// `SymfonyTransportFactory::from_config(&config)` over it for `[symfony.types]`). The one list
/// of the transport factories: the `courier` command line starts from it too.
#[must_use]
pub fn transport_registry() -> TransportRegistry {
    #[allow(unused_mut, reason = "mutated only when a transport feature is on")]
    let mut registry = TransportRegistry::new();
    #[cfg(feature = "sql")]
    registry.register(std::sync::Arc::new(courier_sql::SqlTransportFactory));
    #[cfg(feature = "redis")]
    registry.register(std::sync::Arc::new(courier_redis::RedisTransportFactory));
    #[cfg(feature = "amqp")]
    registry.register(std::sync::Arc::new(courier_amqp::AmqpTransportFactory));
    #[cfg(feature = "nats")]
    registry.register(std::sync::Arc::new(courier_nats::NatsTransportFactory));
    #[cfg(all(
        feature = "symfony",
        any(
            feature = "sqlite",
            feature = "postgres",
            feature = "mysql",
            feature = "redis",
            feature = "amqp"
        )
    ))]
    registry.register(std::sync::Arc::new(
        courier_symfony::SymfonyTransportFactory::default(),
    ));
    registry
}
