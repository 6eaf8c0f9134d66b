//! The AMQP 0-9-1 transport of [Courier](https://docs.rs/courier), for RabbitMQ, on
//! [lapin](https://docs.rs/lapin) with tokio.
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Dsn, Envelope, FactoryContext, Message, MessageRegistry, TransportRegistry};
//! use courier_amqp::AmqpTransportFactory;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u32 }
//! impl Message for Ping { const NAME: &'static str = "app.ping"; }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = TransportRegistry::new().with(Arc::new(AmqpTransportFactory));
//! let dsn = Dsn::parse("amqp://guest:guest@127.0.0.1:5672/%2f?exchange=app&queues[app_ping]=&prefetch=64")?;
//! let messages = Arc::new(MessageRegistry::new().with::<Ping>());
//! let transport = registry.create(FactoryContext::new("async", dsn).registry(messages)).await?;
//! transport.as_setup().expect("amqp has setup").setup().await?;   // exchange, queue, binding
//! transport.send(Envelope::new(Ping { n: 1 })).await?;            // returns once confirmed
//! let got = transport.get(32).await?;                               // pushed, up to 32
//! transport.ack_batch(&got).await?;                                 // one basic.ack(multiple)
//! # Ok(()) }
//! ```
//!
//! # What it does
//!
//! - **Topology**: a durable exchange (default: named like the transport, `fanout`), durable
//!   queues bound to it with binding keys and declaration arguments (`x-queue-type=quorum`,
//!   `x-max-priority`, ...), and the delay topology below. [`Setup`](courier_core::Setup)
//!   declares them idempotently; with `auto_setup` (the default) every (re)connect does.
//! - **Sending**: publisher confirms are always on; `send` returns once the broker confirmed
//!   (bounded by `confirm_timeout`); `send_batch` publishes everything, then waits for all
//!   confirms. Messages are published `mandatory`: one that no queue receives is an error, never
//!   a silent loss. `PriorityStamp` becomes the AMQP priority (queues need `x-max-priority`).
//! - **Receiving**: one consuming channel with `basic.qos(prefetch)` (default 64) and
//!   `basic.consume` on every queue: the broker pushes, nothing polls. `get(max)` takes up to
//!   `max` deliveries already pushed, waiting up to `poll_window` for the first.
//! - **Acks**: by delivery tag ([`DeliveryTagStamp`](courier_core::DeliveryTagStamp)
//!   `<channel generation>.<tag>`); `ack_batch` sends one `basic.ack(multiple)` for the run of
//!   contiguous tags. Acking a delivery of a closed channel, or twice, is a harmless no-op: the
//!   broker already requeued it (and will deliver it again) or removed it. `reject` drops the
//!   message (`requeue=false`). An ack or reject returns once its frame is queued on the
//!   channel, in order, without waiting for the write (the broker confirms neither): one a
//!   dropped connection never wrote is lost like one written just before, and its message comes
//!   again. Under a prefetch of 1 the consumer so waits once per message, for the next
//!   delivery, not twice. `keepalive` is a no-op: a delivery stays with its consumer until
//!   the channel dies (mind RabbitMQ's `consumer_timeout`, 30 min by default).
//! - **Redelivery**: deliveries not acked when their channel or connection dies are requeued by
//!   the broker and delivered again.
//! - **Delays** without the delayed-message plugin: see [`delay`] (per-bucket TTL queues that
//!   dead-letter back; at most 25 % late, never early; up to [`delay::MAX_DELAY`]).
//! - **Retries** ([`Transport::retry`](courier_core::Transport::retry)) go only to the queue the
//!   message was consumed from ([`AmqpReceivedStamp`]), through the default exchange.
//! - **Connection loss**: the next operation reconnects (backoff from 100 ms doubling up to
//!   `max_backoff`), re-declares the topology when `auto_setup`, and `get` resumes consuming.
//!   While the broker is unreachable, `send` fails at once with a transient
//!   [`TransportErrorKind::Connection`](courier_core::TransportErrorKind) error instead of hanging.
//! - `message_count` is the ready messages of the queues and of the delay bucket queues this
//!   process declared (passive declares) plus those delivered to this consumer and not yet
//!   settled; the consumers are paused while counting so nothing is counted twice. Messages
//!   unacked on other processes' consumers are not counted. AMQP queues are not listable
//!   (`as_listable()` is `None`).
//! - A queue deleted under a running consumer (the broker cancels it) is re-declared by the
//!   next `get` when `auto_setup` is on.
//! - Flow control per key (`concurrency_max`, `concurrency_key`, `fair`) is refused with an
//!   error naming the option: RabbitMQ hands messages to consumers in its own order and keeps
//!   no count shared by every worker, so a limit here could only be per process, which would
//!   be wrong across hosts. A slot store beside the broker (Redis or SQL) could hold the slots,
//!   but a message whose key is full would already be delivered and would have to be requeued
//!   or held, filling the consumer's window. Use a SQL or Redis transport for a keyed queue;
//!   strict FIFO is kept here.
//!
//! # Wire format
//!
//! Body: the message JSON. `content_type` property: `application/json`. Every other Courier
//! header (`type`, `x-courier-stamp-*`, extra headers) is an AMQP long-string header. The
//! transport message id is the `message_id` property. Non-string headers from foreign producers
//! are read as text where they are scalars; the broker's `x-death` bookkeeping is dropped.
//!
//! # Options
//!
//! See [`AmqpOptions`] for the DSN form (`exchange`, `exchange_type`, `queues[NAME]=keys`,
//! `queue_arguments[NAME][ARG]=value`, `routing_key`, `prefetch`, `persistent`,
//! `confirm_timeout`, `auto_setup`, `poll_window`, `connect_timeout`, `max_backoff`).
//! Tested against RabbitMQ 3.10 (Debian's package).

pub mod consume;
pub mod delay;
mod factory;
mod inbox;
mod link;
mod options;
mod transport;
mod wire;

pub use factory::AmqpTransportFactory;
pub use options::{AmqpOptions, ArgumentValue, ExchangeType, QueueOptions};
pub use transport::{AmqpReceivedStamp, AmqpTransport};
