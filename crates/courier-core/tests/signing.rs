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

#[tokio::test]
async fn the_config_signing_table_signs_what_the_bus_built_from_it_sends() {
    let text = "[transports.async]\ndsn = \"in-memory://\"\n[routing]\n\"courier.*\" = \"async\"\n\
         [signing]\nkeys = [\"${KEY}\"]\nmessages = [\"courier.*\"]\n";
    let config = courier_core::config::Config::parse_with(text, |v| {
        (v == "KEY").then(|| signing::NEW_KEY.to_owned())
    })
    .unwrap();
    let transports = config
        .connect(
            &courier_core::TransportRegistry::new(),
            courier_test::registry(),
        )
        .await
        .unwrap();
    let bus = transports.bus_builder().build();
    let sent = bus.dispatch(TestMessage::new(1)).await.unwrap();
    let queue = transports.get("async").unwrap();
    let received = queue.get(1).await.unwrap();
    assert!(sent.has::<courier_core::SentStamp>());
    let signature = received[0].last::<SignatureStamp>().unwrap();
    let keys = courier_core::SigningKeys::new([signing::NEW_KEY]).unwrap();
    assert_eq!(Some(signature.key.as_str()), keys.ids().next());
}

#[tokio::test]
async fn a_stamp_a_worker_hook_adds_does_not_break_the_signature() {
    let queue = Arc::new(InMemoryTransport::with_options(
        InMemoryOptions::default().serialize(true),
        courier_test::registry(),
    ));
    signing::producer(&[signing::NEW_KEY], queue.clone())
        .dispatch(TestMessage::new(1))
        .await
        .unwrap();
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = handled.clone();
    let bus = courier_core::MessageBus::builder()
        .messages(courier_test::registry())
        .signing(
            courier_core::Signing::new(courier_core::SigningKeys::new([signing::NEW_KEY]).unwrap())
                .messages(["courier.*"]),
        )
        .handler_fn("count", move |_: Arc<TestMessage>| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<(), courier_core::HandlerError>(()) }
        })
        .build();
    let stats = courier_core::Worker::builder(bus)
        .receiver("queue", queue)
        .on_received(|r| r.add_stamp(courier_core::PriorityStamp(7)))
        .limit(1)
        .build()
        .run(courier_core::CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        handled.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{stats:?}"
    );
}
