//! Signed messages on the in-memory transport (wire mode, so stored messages are really
//! rewritten), the bus's own signing step, and the config's `[signing]` table.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    Encoded, InMemoryOptions, InMemoryTransport, SignatureStamp, Transport, async_trait,
};
use courier_test::{Harness, TestMessage, signing};

struct Memory;

#[async_trait]
impl Harness for Memory {
    async fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(InMemoryTransport::with_options(
            InMemoryOptions::default().serialize(true),
            courier_test::registry(),
        ))
    }
    async fn expire_deliveries(&self, _: &Arc<dyn Transport>) {}
    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        // The harness made every transport: a wire-mode memory transport.
        let wire = courier_test::registry().decode(encoded);
        transport.send(wire).await.unwrap();
    }
    fn poll_window(&self) -> Duration {
        Duration::from_millis(10)
    }
}

#[tokio::test]
async fn in_memory_tampered_unsigned_and_unknown_key_messages_end_in_the_failure_transport() {
    signing::tampered_messages_end_in_the_failure_transport(&Memory).await;
}

#[tokio::test]
async fn only_the_configured_types_are_signed() {
    let queue = InMemoryTransport::new();
    let bus = courier_core::MessageBus::builder()
        .messages(courier_test::registry())
        .transport("q", Arc::new(queue.clone()))
        .route("*", ["q"])
        .signing(
            courier_core::Signing::new(courier_core::SigningKeys::new([signing::NEW_KEY]).unwrap())
                .messages(["orders.*"]),
        )
        .build();
    bus.dispatch(TestMessage::new(1)).await.unwrap();
    assert!(!queue.sent()[0].has::<SignatureStamp>());
}
