//! Test support for Courier transports: the shared conformance suite every transport runs
//! against its real server, a test message, and environment / naming helpers.
//!
//! A transport crate implements [`Harness`] for its backend and calls
//! [`conformance_suite!`] once; that expands to one `#[tokio::test]` per case of
//! [`conformance`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Encoded, InMemoryTransport, InMemoryOptions, Transport, async_trait};
//! use courier_test::Harness;
//!
//! struct MemoryHarness;
//!
//! #[async_trait]
//! impl Harness for MemoryHarness {
//!     async fn transport(&self) -> Arc<dyn Transport> {
//!         Arc::new(InMemoryTransport::with_options(InMemoryOptions::default(), courier_test::registry()))
//!     }
//!     async fn expire_deliveries(&self, _t: &Arc<dyn Transport>) { /* ... */ }
//!     async fn send_raw(&self, _t: &Arc<dyn Transport>, _e: Encoded) { /* ... */ }
//! }
//!
//! async fn harness() -> MemoryHarness { MemoryHarness }
//!
//! courier_test::conformance_suite!(harness);
//! ```

pub mod cleanup;
pub mod conformance;
pub mod dedup;
pub mod env;
pub mod serializer;
pub mod signing;

use std::sync::Arc;
use std::time::Duration;

pub use cleanup::Cleanup;

use courier_core::{Encoded, Message, MessageRegistry, Transport, async_trait};
use serde::{Deserialize, Serialize};

/// The message the conformance suite sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestMessage {
    /// A sequence number, to check order and count.
    pub seq: u64,
    /// Free text (unicode, large bodies).
    pub text: String,
}

impl Message for TestMessage {
    const NAME: &'static str = "courier.test";
}

impl TestMessage {
    /// A message with `seq` and a short text.
    #[must_use]
    pub fn new(seq: u64) -> Self {
        Self {
            seq,
            text: format!("message {seq}"),
        }
    }
}

/// A registry that knows [`TestMessage`].
#[must_use]
pub fn registry() -> Arc<MessageRegistry> {
    Arc::new(MessageRegistry::new().with::<TestMessage>())
}

/// Runs a harness's async teardown from its `Drop`: on the test's own runtime when it is
/// multi-threaded, else on a runtime of its own in another thread (a current-thread runtime
/// cannot block on itself).
pub fn block_on_teardown(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(cleanup));
        }
        _ => {
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(cleanup);
                }
            })
            .join();
        }
    }
}

/// A stored message no producer should write, which must still surface as a decode-error
/// envelope (and never fail a `get` or hold up the messages beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Poison {
    /// A body whose bytes are not UTF-8 ([`POISON_BODY`]), with headers naming
    /// [`TestMessage`].
    BinaryBody,
    /// A body stored as a value of another type (SQL: an integer), where the storage allows it.
    BodyOfAnotherType,
    /// No body at all (SQL: NULL; Redis: no `body` field), where the storage allows it.
    MissingBody,
    /// Headers whose bytes are not UTF-8 text.
    BinaryHeaders,
    /// Headers that are text but not a JSON object (`not json`).
    HeadersNotJson,
    /// No headers at all (SQL: NULL; Redis: no `headers` field; AMQP: no `type` header).
    MissingHeaders,
}

impl Poison {
    /// Every kind, for the conformance case.
    pub const ALL: [Poison; 6] = [
        Poison::BinaryBody,
        Poison::BodyOfAnotherType,
        Poison::MissingBody,
        Poison::BinaryHeaders,
        Poison::HeadersNotJson,
        Poison::MissingHeaders,
    ];
}

/// The body of [`Poison::BinaryBody`]: JSON for a [`TestMessage`] behind bytes that are not
/// UTF-8.
pub const POISON_BODY: &[u8] = b"\xff\xfe\x00{\"seq\":1,\"text\":\"x\"}";

/// The headers most poisons carry: `type` naming [`TestMessage`], as a JSON object.
pub const POISON_HEADERS: &str = r#"{"content-type":"application/json","type":"courier.test"}"#;

/// What the conformance suite needs from a backend beyond the [`Transport`] trait.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A transport on a fresh, empty, set-up queue / table / stream of its own (a unique name),
    /// decoding with [`registry`]. Each call gives a new, isolated queue.
    async fn transport(&self) -> Arc<dyn Transport>;

    /// Makes every live delivery of `transport` eligible for redelivery now, as if its consumer
    /// had died and the redelivery window had passed (SQL: rewrite `delivered_at`; Redis: a
    /// short `redeliver_timeout`; AMQP: close the consuming channel without acking).
    async fn expire_deliveries(&self, transport: &Arc<dyn Transport>);

    /// Stores a message in wire form, as a producer in another language would.
    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded);

    /// A transport like [`Harness::transport`] (its own fresh queue) whose redelivery window is
    /// `window`: a received message neither acked nor kept alive is delivered again about
    /// `window` after it was received (SQL and Redis: `redeliver_timeout`; NATS: `ack_wait`),
    /// and its [`Capabilities::redeliver_after`](courier_core::Capabilities::redeliver_after)
    /// says so. The keepalive case waits it out to see that `keepalive` postpones the
    /// redelivery. `None` (the default) only where the backend has no redelivery window
    /// (`redeliver_after` is `None`: AMQP, whose deliveries stay with their consumer); for a
    /// transport that has one, the keepalive case fails on `None`.
    async fn transport_with_redelivery(&self, _window: Duration) -> Option<Arc<dyn Transport>> {
        None
    }

    /// Stores a poison message straight into the transport's storage with the raw driver
    /// (see [`Poison`]), as a buggy producer or a hand edit would; returns `false` when the
    /// storage cannot hold that kind of poison (the case then skips it).
    async fn store_poison(&self, _transport: &Arc<dyn Transport>, _poison: Poison) -> bool {
        false
    }

    /// Breaks the transport's server connections (kill them or restart the server); returns
    /// `false` when the backend has no connection to break (in-process transports).
    async fn break_connection(&self, _transport: &Arc<dyn Transport>) -> bool {
        false
    }

    /// The longest a `get` may wait before returning empty (the poll window); the suite waits
    /// this long plus slack for delayed messages.
    fn poll_window(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Whether `get` honours `PriorityStamp` (ordering tests are skipped where not).
    fn supports_priority(&self) -> bool {
        true
    }

    /// How long one transport operation (besides a `get`'s poll window) may take before a case
    /// fails instead of hanging. Default 10 s; raise it for slow servers.
    fn operation_timeout(&self) -> Duration {
        Duration::from_secs(10)
    }

    /// How long the transport may take to recover after [`Harness::break_connection`]
    /// (operations failing with transient errors are retried until then). Default 30 s.
    fn reconnect_timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
}
