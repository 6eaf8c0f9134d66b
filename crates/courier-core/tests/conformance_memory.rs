//! The shared conformance suite (`courier_test::conformance`) on [`InMemoryTransport`] in
//! serialize mode, so every message really goes through the wire format, and again (module
//! `values`) in its default mode, storing envelopes as values.
//!
//! Redelivery: each transport gets a short `redeliver_timeout` ([`REDELIVER`]) and
//! `expire_deliveries` sleeps just past it. (tokio's paused clock would be instant, but it
//! needs a current-thread runtime and the suite runs on the multi-thread one.) Deliveries in
//! the suite are acked within milliseconds, far inside the window.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier_core::{Encoded, InMemoryOptions, InMemoryTransport, Transport, async_trait};
use courier_test::Harness;

/// The redelivery window of the harness's transports.
const REDELIVER: Duration = Duration::from_millis(1000);

#[derive(Default)]
struct MemoryHarness {
    /// Encode on send and decode on get (the default test mode), or store envelopes as values.
    values: bool,
    /// Every transport handed out, kept concrete for `send_raw`.
    created: Mutex<Vec<Arc<InMemoryTransport>>>,
}

impl MemoryHarness {
    /// A transport redelivering after `redeliver`, kept for `send_raw`.
    fn make(&self, redeliver: Duration) -> Arc<dyn Transport> {
        let options = InMemoryOptions::default()
            .serialize(!self.values)
            .redeliver_timeout(redeliver);
        let transport = Arc::new(InMemoryTransport::with_options(
            options,
            courier_test::registry(),
        ));
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&transport));
        transport
    }

    fn concrete(&self, transport: &Arc<dyn Transport>) -> Arc<InMemoryTransport> {
        let wanted = Arc::as_ptr(transport).cast::<()>();
        let created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        let found = created
            .iter()
            .find(|c| Arc::as_ptr(c).cast::<()>() == wanted);
        Arc::clone(found.expect("the transport was not created by this harness"))
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        self.make(REDELIVER)
    }

    async fn transport_with_redelivery(&self, window: Duration) -> Option<Arc<dyn Transport>> {
        Some(self.make(window))
    }

    async fn expire_deliveries(&self, _transport: &Arc<dyn Transport>) {
        tokio::time::sleep(REDELIVER + Duration::from_millis(50)).await;
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        self.concrete(transport).send_raw(encoded);
    }

    fn poll_window(&self) -> Duration {
        // `get` never waits: it returns what is due at once.
        Duration::from_millis(100)
    }
}

async fn harness() -> MemoryHarness {
    MemoryHarness::default()
}

courier_test::conformance_suite!(harness);

/// The same suite with envelopes stored as values (`serialize(false)`, the default mode).
mod values {
    use super::MemoryHarness;

    async fn harness() -> MemoryHarness {
        MemoryHarness {
            values: true,
            ..MemoryHarness::default()
        }
    }

    courier_test::conformance_suite!(harness);
}
