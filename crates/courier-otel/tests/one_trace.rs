//! One trace runs from a dispatch through the transport to the handler, and on through a
//! message the handler dispatches: checked with OpenTelemetry's in-memory exporter, on SQLite
//! and on Redis.
//!
//! One subscriber serves the whole binary, installed as the global default: a span whose last
//! reference drops on another thread closes its parent through that thread's default
//! subscriber (sqlx's SQLite worker thread holds the span of each statement it runs), which a
//! thread-local `set_default` would not reach, and the parent would never end. Each test finds
//! its own trace by the `journey` field of its root span.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use courier_core::{
    CancellationToken, Dsn, HandlerError, Message, MessageBus, MessageRegistry, Transport, Worker,
};
use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tracing_subscriber::layer::SubscriberExt;

#[derive(Serialize, Deserialize)]
struct Order {
    id: u32,
}

impl Message for Order {
    const NAME: &'static str = "shop.order";
}

#[derive(Serialize, Deserialize)]
struct Invoice {
    order: u32,
}

impl Message for Invoice {
    const NAME: &'static str = "shop.invoice";
}

/// Every network await of the journey together.
const DEADLINE: Duration = Duration::from_secs(30);

/// The binary's one tracer provider and its exporter, installed globally on first use.
fn exporter() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static GLOBAL: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry().with(courier_otel::layer(&provider));
        tracing::subscriber::set_global_default(subscriber).expect("the one global subscriber");
        (provider, exporter)
    })
}

/// Dispatches an `Order` inside a `checkout` span (field `journey = name`) on a bus routed to
/// `transport`; a worker handles it, its handler dispatches an `Invoice` to the same transport,
/// the worker handles that. Returns the spans of the checkout's trace and the id the transport
/// gave the order.
async fn journey(transport: Arc<dyn Transport>, name: &str) -> (Vec<SpanData>, String) {
    let (provider, exporter) = exporter();

    let bus = MessageBus::builder()
        .messages(registry())
        .transport("orders", transport.clone())
        .route("shop.*", ["orders"])
        .handler_fn("bill", |order: Arc<Order>| async move {
            let bus = MessageBus::current().ok_or_else(|| HandlerError::msg("no current bus"))?;
            bus.dispatch(Invoice { order: order.id }).await?;
            Ok::<(), HandlerError>(())
        })
        .handler_fn("file", |_: Arc<Invoice>| async {
            Ok::<(), HandlerError>(())
        })
        .build();

    let checkout = tracing::info_span!("checkout", journey = name);
    let sent = tokio::time::timeout(
        DEADLINE,
        tracing::Instrument::instrument(bus.dispatch(Order { id: 7 }), checkout.clone()),
    )
    .await
    .expect("dispatch timed out")
    .expect("dispatch failed");
    drop(checkout);
    let order_id = sent
        .id()
        .expect("the transport gave the order an id")
        .to_owned();

    let stats = tokio::time::timeout(
        DEADLINE,
        Worker::builder(bus)
            .receiver("orders", transport)
            .limit(2)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("the worker did not handle both messages in time")
    .expect("the worker failed");
    assert_eq!((stats.handled, stats.failed), (2, 0));

    // A span ends when its last reference drops, which may be on another thread a moment
    // after the worker returns.
    let trace = tokio::time::timeout(DEADLINE, async {
        loop {
            provider.force_flush().expect("flush");
            let spans = exporter.get_finished_spans().expect("finished spans");
            let root = spans
                .iter()
                .find(|s| s.name == "checkout" && attribute(s, "journey").as_deref() == Some(name));
            if let Some(root) = root {
                return root.span_context.trace_id();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the checkout span did not end");
    let spans = exporter.get_finished_spans().expect("finished spans");
    let spans = spans
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect();
    (spans, order_id)
}

/// The application's messages, for the bus and the transport alike.
fn registry() -> Arc<MessageRegistry> {
    Arc::new(MessageRegistry::new().with::<Order>().with::<Invoice>())
}

async fn setup(transport: &dyn Transport) {
    if let Some(setup) = transport.as_setup() {
        tokio::time::timeout(DEADLINE, setup.setup())
            .await
            .expect("setup timed out")
            .expect("setup");
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The one span named `name` for message type `message`.
fn find<'a>(spans: &'a [SpanData], name: &str, message: &str) -> &'a SpanData {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| {
            s.name == name && attribute(s, "courier.message.type").as_deref() == Some(message)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one `{name}` span for {message}, in {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

fn assert_messaging(span: &SpanData, system: &str, operation: &str, kind: SpanKind, id: &str) {
    let name = &span.name;
    assert_eq!(span.span_kind, kind, "{name}");
    assert_eq!(
        attribute(span, "messaging.system").as_deref(),
        Some(system),
        "{name}"
    );
    assert_eq!(
        attribute(span, "messaging.destination.name").as_deref(),
        Some("orders"),
        "{name}"
    );
    assert_eq!(
        attribute(span, "messaging.operation.type").as_deref(),
        Some(operation),
        "{name}"
    );
    assert_eq!(
        attribute(span, "messaging.message.id").as_deref(),
        Some(id),
        "{name}"
    );
}

/// The whole chain: one trace id, each span parented on the one before it.
fn assert_one_trace(spans: &[SpanData], system: &str, order_id: &str) {
    let checkout = spans
        .iter()
        .find(|s| s.name == "checkout")
        .expect("the checkout span");
    let send_order = find(spans, "send orders", Order::NAME);
    let process_order = find(spans, "process orders", Order::NAME);
    let send_invoice = find(spans, "send orders", Invoice::NAME);
    let process_invoice = find(spans, "process orders", Invoice::NAME);

    let trace: TraceId = checkout.span_context.trace_id();
    for span in [send_order, process_order, send_invoice, process_invoice] {
        assert_eq!(
            span.span_context.trace_id(),
            trace,
            "{} is in the trace",
            span.name
        );
    }
    let parent = |span: &SpanData| -> SpanId { span.parent_span_id };
    assert_eq!(parent(send_order), checkout.span_context.span_id());
    assert_eq!(parent(process_order), send_order.span_context.span_id());
    assert_eq!(parent(send_invoice), process_order.span_context.span_id());
    assert_eq!(parent(process_invoice), send_invoice.span_context.span_id());

    assert_messaging(send_order, system, "send", SpanKind::Producer, order_id);
    assert_messaging(
        process_order,
        system,
        "process",
        SpanKind::Consumer,
        order_id,
    );
    let invoice_id = attribute(send_invoice, "messaging.message.id").expect("the invoice's id");
    assert_ne!(invoice_id, order_id);
    assert_messaging(
        send_invoice,
        system,
        "send",
        SpanKind::Producer,
        &invoice_id,
    );
    assert_messaging(
        process_invoice,
        system,
        "process",
        SpanKind::Consumer,
        &invoice_id,
    );
}

#[tokio::test]
async fn one_trace_runs_through_sqlite_to_a_message_dispatched_in_the_handler() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("courier.db");
    let dsn = Dsn::parse(&format!("sqlite://{}?poll_window=100ms", path.display())).expect("dsn");
    let transport = tokio::time::timeout(
        DEADLINE,
        courier_sql::SqlTransport::connect("orders", &dsn, registry()),
    )
    .await
    .expect("connecting timed out")
    .expect("connect to sqlite");
    let transport: Arc<dyn Transport> = Arc::new(transport);
    setup(&*transport).await;

    let (spans, order_id) = journey(transport, "sqlite").await;
    assert_one_trace(&spans, "sqlite", &order_id);
}

#[tokio::test]
#[ignore = "needs Redis: set COURIER_TEST_REDIS_URL"]
async fn one_trace_runs_through_redis_to_a_message_dispatched_in_the_handler() {
    let url = courier_test::env::redis_url();
    // The stream's keys are deleted when the test ends, pass or fail.
    let cleanup = courier_test::Cleanup::new();
    let stream = cleanup.redis_name("courier_otel");
    let options = courier_redis::RedisOptions::default()
        .stream(&stream)
        .poll_window(Duration::from_millis(100));
    let transport = tokio::time::timeout(
        DEADLINE,
        courier_redis::RedisTransport::connect(&url, options, registry()),
    )
    .await
    .expect("connecting to redis timed out")
    .expect("connect to redis");
    let transport = Arc::new(transport);
    setup(&*transport).await;

    let (spans, order_id) = journey(transport.clone(), "redis").await;
    assert_one_trace(&spans, "redis", &order_id);
}
