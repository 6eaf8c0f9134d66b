//! The NATS JetStream transport of [Courier](https://docs.rs/courier), on
//! [async-nats](https://docs.rs/async-nats) with tokio.
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Dsn, Envelope, FactoryContext, Message, MessageRegistry, TransportRegistry};
//! use courier_nats::NatsTransportFactory;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u32 }
//! impl Message for Ping { const NAME: &'static str = "app.ping"; }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = TransportRegistry::new().with(Arc::new(NatsTransportFactory));
//! let dsn = Dsn::parse("nats://127.0.0.1:4222/orders?ack_wait=30s")?;
//! let messages = Arc::new(MessageRegistry::new().with::<Ping>());
//! let transport = registry.create(FactoryContext::new("async", dsn).registry(messages)).await?;
//! transport.as_setup().expect("nats has setup").setup().await?;   // stream + durable consumer
//! transport.send(Envelope::new(Ping { n: 1 })).await?;            // returns once the PubAck came
//! let got = transport.get(32).await?;                               // pulled, up to 32
//! transport.ack_batch(&got).await?;                                 // the acks, pipelined
//! # Ok(()) }
//! ```
//!
//! # What it does
//!
//! - **Topology**: one JetStream stream per transport (named by the DSN's path, else by the
//!   transport; a *work queue*, so an acked or rejected message is deleted) capturing two
//!   subjects: the subject (default `<stream>.messages`) and the delay subject (default
//!   `<subject>.delayed`). One durable pull consumer (default `courier`) reads the subject,
//!   with explicit acks, an `ack_wait` (default 30 s) and `max_ack_pending` (default 10 000);
//!   every worker of the transport pulls from it, so each message goes to one of them. A
//!   second one, `<consumer>-delayed`, holds delayed messages (see below).
//!   [`Setup`](courier_core::Setup) creates or updates the stream and both consumers
//!   idempotently; with `auto_setup` (the default) the first operation does. Stream and
//!   consumer names are checked against JetStream's rules (no whitespace, `.`, `*`, `>`, `/`,
//!   `\`) up front.
//! - **Sending**: `send` publishes and returns once the server's PubAck came (the stream
//!   stored it); `send_batch` publishes a chunk of up to 1024, then awaits all their PubAcks
//!   together, and fails if any failed. An envelope with a
//!   [`MessageIdStamp`](courier_core::MessageIdStamp) is published with
//!   `Nats-Msg-Id: <id>:<digest of body and headers>`, so the same stored envelope sent twice
//!   within the stream's `duplicate_window` (default 2 min), as a relay that died between its
//!   publish and its source ack does, is stored once; a retry (new stamps) is a new message.
//! - **Receiving**: `get(max)` pulls what is there at once (a `no_wait` fetch of `max`); if
//!   nothing is, it waits up to `poll_window` (default 1 s) for one message, then takes what
//!   else is there. The server's wait is a real blocking wait, not polling.
//! - **Acks**: `ack` is `+ACK` and waits for the server's answer (`ack_batch` sends them all
//!   at once); `reject` is `+TERM`; `keepalive` is `+WPI`, which restarts the delivery's
//!   `ack_wait`. Acking twice is harmless. JetStream acks by stream sequence, whatever the
//!   delivery: so the transport remembers the newest delivery of each message it handed out,
//!   and the late ack of a superseded delivery is a no-op. A late ack from *another* process,
//!   whose delivery expired and went to this one, still removes the message (it was handled).
//! - **Redelivery**: a delivery neither acked nor kept alive within `ack_wait` is delivered
//!   again (to any worker), with the same id; `max_deliver` is unlimited.
//! - **Delays** (`DelayStamp`): the message is published at once on the *delay subject*, with
//!   a `Courier-Delay` header (milliseconds). There it waits for the delay consumer, never in
//!   the pending window of the consumer workers pull from: 20 000 messages delayed by an hour
//!   do not hold up one sent without a delay. Each transport that `get`s runs a promoter task
//!   (started by its first `get`, stopped by `close` or drop) pulling the delay consumer: a
//!   message not due yet goes back with `-NAK {"delay": what is left}`, and the server offers
//!   it again when due; a due one is published on the subject (`Nats-Msg-Id:
//!   courier-delayed:<its sequence>`, so a promotion repeated after a crash within the
//!   duplicate window is stored once), then acked. So it is never delivered early (the due
//!   time is the server's store time plus the delay, read against the promoter's clock: keep
//!   the clocks in sync, as NTP does, or a promoter whose clock runs ahead promotes early by
//!   the difference). A message found on the subject with the delay header before its time
//!   (another producer's, or one sent before delayed messages had a subject of their own) is
//!   moved to the delay subject the same way. Delays have no maximum.
//!
//!   **The limit that remains**: the delay consumer holds at most `max_delayed` (default
//!   100 000) delayed messages at once, each a pending entry on the server (memory, and the
//!   consumer's state on disk). Past that, further delayed messages wait unread in the stream,
//!   in order, until held ones fall due and are promoted: a short delay sent behind more than
//!   `max_delayed` longer ones is *late* (never early, never lost), while messages without a
//!   delay are never held up. Raise `max_delayed` for more long delays at once. A stream set
//!   up by an older version lacks the delay subject until setup runs again: with
//!   `auto_setup=false`, a delayed send fails with a `NotFound` error naming the subject.
//! - **Retries** follow the trait's default: the new envelope (new stamps, the delay) is
//!   published first, the old delivery acked second, so a crash in between means a duplicate,
//!   never a loss.
//! - **Connection loss**: async-nats reconnects by itself (backoff from 100 ms doubling up to
//!   `max_backoff`); while it is disconnected, operations fail at once with a transient
//!   [`TransportErrorKind::Connection`](courier_core::TransportErrorKind) error instead of
//!   queueing, and so does an operation whose answer (a PubAck, an ack's reply, a pull) the
//!   broken connection will not bring. A publish cut short may have been stored (at least
//!   once; `Nats-Msg-Id` deduplicates the resend of an envelope with a message id); an ack cut
//!   short may not have been, and the delivery comes back after `ack_wait`. Deliveries are
//!   server state: they survive the reconnect and can be acked after it. A first connect that
//!   fails is retried by the next operation after the same backoff. The conformance suite
//!   cuts the connections through a TCP proxy; a restart of the server under a running
//!   producer and consumer lost nothing either (checked by hand, not in the suite).
//! - `message_count` is the stream's message count: a work queue holds exactly the messages
//!   not yet acked or rejected (waiting, in flight, delayed on the delay subject). Streams
//!   are not listable (`as_listable()` is `None`) and have no priorities.
//! - Credentials: `nats://user:pass@host` or `?token=...`; both are redacted wherever the DSN
//!   is shown, and never in `Debug`. A user without a password is refused (it might be a token
//!   in the wrong place). TLS (`tls://`) is not supported.
//! - Flow control per key (`concurrency_max`, `concurrency_key`, `fair`) is refused with an
//!   error naming the option: NATS JetStream hands messages to consumers in its own order and keeps
//!   no count shared by every worker, so a limit here could only be per process, which would
//!   be wrong across hosts. A slot store beside the broker (Redis or SQL) could hold the slots,
//!   but a message whose key is full would already be delivered and would have to be requeued
//!   or held, filling the consumer's window. Use a SQL or Redis transport for a keyed queue;
//!   strict FIFO is kept here.
//!
//! # Wire format
//!
//! Payload: the message body. Every Courier header (`type`, `content-type`,
//! `x-courier-stamp-*`, extra headers) is a NATS header of the same name. The transport message
//! id is the stream sequence. On receive, `Nats-*` headers and `Courier-Delay` are dropped.
//! NATS headers are text lines: a header value with a line break or surrounding whitespace is
//! refused on send (an [`Encode`](courier_core::TransportErrorKind::Encode) error naming it);
//! async-nats cannot read a message whose headers are not UTF-8.
//!
//! # Options
//!
//! See [`NatsOptions`] for the DSN form (`subject`, `consumer`, `delay_subject`, `max_delayed`,
//! `ack_wait`, `max_ack_pending`, `poll_window`, `request_timeout`, `connect_timeout`,
//! `max_backoff`, `auto_setup`, `duplicate_window`, `storage`, `replicas`, `serializer`,
//! `token`). Tested against
//! nats-server 2.9.10 (Debian's package) with JetStream enabled. A message (body plus headers)
//! must fit the server's `max_payload` (1 MiB by default; raise it to carry 1 MiB bodies).

mod delayed;
mod deliveries;
mod errors;
mod factory;
mod link;
mod options;
mod transport;
mod wire;

pub use factory::NatsTransportFactory;
pub use options::{NatsOptions, StorageType};
pub use transport::NatsTransport;
