//! Deduplication on dispatch (`DeduplicateStamp`) on the in-memory transport and the bus store.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    BusError, Capabilities, DeduplicateStamp, DeduplicatedStamp, Envelope, HandlerError,
    InMemoryTransport, MemoryDeduplicator, MessageBus, MessageCount, SentStamp, Transport,
    TransportError, TransportErrorKind, async_trait,
};
use courier_test::{TestMessage, dedup};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_concurrent_dispatches_enqueue_exactly_one_in_memory() {
    let queue = InMemoryTransport::new();
    let bus = dedup::bus(Arc::new(queue.clone()));
    dedup::concurrent_dispatches_send_exactly_one(&bus, "order-42", 100).await;
    assert_eq!(queue.message_count().await.unwrap(), 1);
    assert_eq!(queue.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_key_can_be_sent_again_after_its_ttl() {
    let queue = InMemoryTransport::new();
    let bus = dedup::bus(Arc::new(queue.clone()));
    let ttl = Duration::from_secs(60);
    assert!(dedup::dispatch_once(&bus, "k", ttl).await);
    assert!(!dedup::dispatch_once(&bus, "k", ttl).await);
    assert!(dedup::dispatch_once(&bus, "other", ttl).await);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(!dedup::dispatch_once(&bus, "k", ttl).await);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(dedup::dispatch_once(&bus, "k", ttl).await);
    assert_eq!(queue.sent().len(), 3);
}

#[tokio::test]
async fn a_message_without_the_stamp_is_never_deduplicated() {
    let queue = InMemoryTransport::new();
    let bus = dedup::bus(Arc::new(queue.clone()));
    for i in 0..3 {
        bus.dispatch(TestMessage::new(i)).await.unwrap();
    }
    assert_eq!(queue.sent().len(), 3);
}

/// A transport without a deduplication store (as AMQP and `sync://` are).
#[derive(Debug, Default)]
struct NoStore(InMemoryTransport);

#[async_trait]
impl Transport for NoStore {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.0.send(envelope).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.0.get(max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.0.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.0.reject(envelope).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

fn stamped(key: &str) -> Envelope {
    Envelope::new(TestMessage::new(1)).with(DeduplicateStamp::new(key, Duration::from_secs(60)))
}

#[tokio::test]
async fn a_transport_without_a_store_refuses_the_stamp_as_unsupported() {
    let inner = NoStore::default();
    let sent = inner.0.clone();
    let bus = dedup::bus(Arc::new(inner));
    let err = bus.dispatch(stamped("k")).await.unwrap_err();
    match &err {
        BusError::Send { source, .. } => {
            assert_eq!(source.kind(), TransportErrorKind::Unsupported);
            assert!(
                source.to_string().contains("cannot deduplicate"),
                "{source}"
            );
        }
        other => panic!("expected an unsupported send error, got {other:?}"),
    }
    assert!(sent.sent().is_empty(), "nothing was sent");
}

#[tokio::test]
async fn a_bus_store_deduplicates_for_transports_without_one() {
    let inner = NoStore::default();
    let sent = inner.0.clone();
    let bus = MessageBus::builder()
        .messages(courier_test::registry())
        .transport("amqp-like", Arc::new(inner))
        .route("courier.*", ["amqp-like"])
        .deduplicate_store(Arc::new(MemoryDeduplicator::new()))
        .build();
    assert!(bus.dispatch(stamped("k")).await.unwrap().has::<SentStamp>());
    let dup = bus.dispatch(stamped("k")).await.unwrap();
    assert_eq!(
        dup.last::<DeduplicatedStamp>()
            .map(|d| d.transport.as_str()),
        Some("amqp-like")
    );
    assert_eq!(sent.sent().len(), 1);
}

#[tokio::test]
async fn a_locally_handled_message_is_deduplicated_on_the_bus_store() {
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = handled.clone();
    let bus = MessageBus::builder()
        .deduplicate_store(Arc::new(MemoryDeduplicator::new()))
        .handler_fn("count", move |_: Arc<TestMessage>| {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    bus.dispatch(stamped("k")).await.unwrap();
    let dup = bus.dispatch(stamped("k")).await.unwrap();
    assert!(dup.has::<DeduplicatedStamp>());
    assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A transport whose sends fail.
#[derive(Debug, Default)]
struct Failing(InMemoryTransport);

#[async_trait]
impl Transport for Failing {
    async fn send(&self, _: Envelope) -> Result<Envelope, TransportError> {
        Err(TransportError::new(
            TransportErrorKind::Connection,
            "failing",
        ))
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        self.0.get(max).await
    }
    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.0.ack(envelope).await
    }
    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.0.reject(envelope).await
    }
    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.deduplicate = self.0.abilities().deduplicate;
        abilities
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

#[tokio::test]
async fn a_failed_send_releases_its_key() {
    let failing = Arc::new(Failing::default());
    let bus = dedup::bus(failing.clone());
    assert!(bus.dispatch(stamped("k")).await.is_err());
    // The key is free again: the same key is taken by the next caller.
    let store = failing.abilities().deduplicate.unwrap();
    assert!(
        store
            .deduplicate("k", Duration::from_secs(1))
            .await
            .unwrap()
    );
}

/// A message that names its own uniqueness key (`Message::deduplicate`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Invoice {
    id: u64,
}

impl courier_core::Message for Invoice {
    const NAME: &'static str = "test.invoice";

    fn deduplicate(&self) -> Option<DeduplicateStamp> {
        Some(DeduplicateStamp::new(
            format!("invoice:{}", self.id),
            Duration::from_secs(60),
        ))
    }
}

fn invoice_bus(queue: &InMemoryTransport) -> MessageBus {
    MessageBus::builder()
        .transport("async", Arc::new(queue.clone()))
        .route(<Invoice as courier_core::Message>::NAME, ["async"])
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_from_the_message_deduplicates_concurrent_dispatches() {
    let queue = InMemoryTransport::new();
    let bus = invoice_bus(&queue);
    let dispatches = (0..100).map(|_| {
        let bus = bus.clone();
        tokio::spawn(async move { bus.dispatch(Invoice { id: 7 }).await })
    });
    let sent = futures_util::future::join_all(dispatches)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .filter(|e| e.has::<SentStamp>())
        .count();
    assert_eq!(sent, 1);
    let duplicate = bus.dispatch(Invoice { id: 7 }).await.unwrap();
    let stamp = duplicate
        .last::<DeduplicatedStamp>()
        .expect("the caller learns");
    assert_eq!(stamp.key, "invoice:7");
    bus.dispatch(Invoice { id: 8 }).await.unwrap();
    assert_eq!(queue.sent().len(), 2, "another invoice has another key");
}

#[tokio::test]
async fn a_stamp_given_at_dispatch_wins_over_the_message_key() {
    let queue = InMemoryTransport::new();
    let bus = invoice_bus(&queue);
    let with = |key: &str| {
        Envelope::new(Invoice { id: 1 }).with(DeduplicateStamp::new(key, Duration::from_secs(60)))
    };
    bus.dispatch(Invoice { id: 1 }).await.unwrap();
    let sent = bus.dispatch(with("batch-1")).await.unwrap();
    assert!(sent.has::<SentStamp>(), "its own key is free");
    let again = bus.dispatch(with("batch-1")).await.unwrap();
    assert!(again.has::<DeduplicatedStamp>());
    assert_eq!(queue.sent().len(), 2);
}

#[tokio::test]
async fn a_zero_ttl_is_refused_naming_the_key() {
    let queue = InMemoryTransport::new();
    let bus = dedup::bus(Arc::new(queue.clone()));
    let zero = Envelope::new(TestMessage::new(1)).with(DeduplicateStamp::new("k0", Duration::ZERO));
    let err = bus.dispatch(zero).await.unwrap_err();
    let text = format!("{:?}", error_chain(&err));
    assert!(text.contains("`k0`") && text.contains("zero"), "{text}");
    assert!(queue.sent().is_empty(), "nothing sent");
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out
}
