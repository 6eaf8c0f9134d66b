//! Bus, middleware, routing and the sync transport.
#![allow(clippy::unwrap_used, missing_docs)]

use std::future::{Ready, ready};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use courier_core::{
    BusError, BusNameStamp, DispatchAfterCurrentBusStamp, Envelope, HandledStamp, HandlerError,
    InMemoryTransport, Message, MessageBus, Middleware, MultiplierRetryStrategy, Next,
    ReceivedStamp, SentStamp, SentToFailureTransportStamp, TransportNamesStamp, async_trait,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order(u32);
impl Message for Order {
    const NAME: &'static str = "shop.order";
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Mail(u32);
impl Message for Mail {
    const NAME: &'static str = "mail.send";
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn counting(
    c: &Arc<AtomicUsize>,
) -> impl Fn(Arc<Order>) -> Ready<Result<(), HandlerError>> + Send + Sync + 'static {
    let c = c.clone();
    move |_| {
        c.fetch_add(1, Ordering::SeqCst);
        ready(Ok(()))
    }
}

#[tokio::test]
async fn an_unrouted_message_runs_every_handler() {
    let (a, b) = (counter(), counter());
    let bus = MessageBus::builder()
        .handler_fn("a", counting(&a))
        .handler_fn("b", counting(&b))
        .build();
    let env = bus.dispatch(Order(1)).await.unwrap();
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 1));
    let handled: Vec<&str> = env
        .all::<HandledStamp>()
        .map(|h| h.handler.as_str())
        .collect();
    assert_eq!(handled, ["a", "b"]);
    assert_eq!(
        env.last::<BusNameStamp>().map(|b| b.0.as_str()),
        Some("default")
    );
}

#[tokio::test]
async fn a_routed_message_is_sent_to_every_transport_and_not_handled() {
    let a = counter();
    let (q1, q2) = (InMemoryTransport::new(), InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("q1", Arc::new(q1.clone()))
        .transport("q2", Arc::new(q2.clone()))
        .route("shop.*", ["q1", "q2"])
        .handler_fn("a", counting(&a))
        .build();
    let env = bus.dispatch(Order(1)).await.unwrap();
    assert_eq!((q1.sent().len(), q2.sent().len()), (1, 1));
    assert_eq!(a.load(Ordering::SeqCst), 0);
    let sent: Vec<&str> = env
        .all::<SentStamp>()
        .map(|s| s.transport.as_str())
        .collect();
    assert_eq!(sent, ["q1", "q2"]);
}

#[tokio::test]
async fn a_received_message_is_handled_never_sent_again() {
    let a = counter();
    let q = InMemoryTransport::new();
    let bus = MessageBus::builder()
        .transport("q", Arc::new(q.clone()))
        .route("*", ["q"])
        .handler_fn("a", counting(&a))
        .build();
    bus.dispatch(Envelope::new(Order(1)).with(ReceivedStamp("q".into())))
        .await
        .unwrap();
    assert_eq!(q.sent().len(), 0);
    assert_eq!(a.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn transport_names_stamp_overrides_routing() {
    let (q1, q2) = (InMemoryTransport::new(), InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("q1", Arc::new(q1.clone()))
        .transport("q2", Arc::new(q2.clone()))
        .route("shop.*", ["q1"])
        .build();
    bus.dispatch(Envelope::new(Order(1)).with(TransportNamesStamp(vec!["q2".into()])))
        .await
        .unwrap();
    assert_eq!((q1.sent().len(), q2.sent().len()), (0, 1));
    let err = bus
        .dispatch(Envelope::new(Order(1)).with(TransportNamesStamp(vec!["nope".into()])))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BusError::UnknownTransport { ref transport, .. } if transport == "nope"),
        "{err}"
    );
}

#[tokio::test]
async fn handler_failures_are_collected_and_handled_stamps_make_a_retry_skip_successes() {
    let ok = counter();
    let fails = counter();
    let f = fails.clone();
    let bus = MessageBus::builder()
        .handler_fn("ok", counting(&ok))
        .handler_fn("flaky", move |_: Arc<Order>| {
            let n = f.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    Err(HandlerError::msg("first time fails"))
                } else {
                    Ok(())
                }
            }
        })
        .handler_fn("broken", |_: Arc<Order>| async {
            Err::<(), _>(HandlerError::unrecoverable("always"))
        })
        .build();
    let err = bus.dispatch(Order(1)).await.unwrap_err();
    let BusError::HandlerFailed { envelope, failures } = err else {
        panic!("expected HandlerFailed")
    };
    let names: Vec<&str> = failures.iter().map(|f| f.handler.as_str()).collect();
    assert_eq!(names, ["flaky", "broken"]);
    // Retry with the returned envelope: `ok` must not run again.
    let err = bus.dispatch(*envelope).await.unwrap_err();
    assert_eq!(ok.load(Ordering::SeqCst), 1);
    assert_eq!(fails.load(Ordering::SeqCst), 2);
    let BusError::HandlerFailed { failures, .. } = err else {
        panic!("expected HandlerFailed")
    };
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].handler, "broken");
}

#[tokio::test]
async fn no_handler_is_an_error_naming_the_message() {
    let bus = MessageBus::builder().build();
    let err = bus.dispatch(Order(1)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "no handler and no transport for message `shop.order`"
    );
}

struct Record(&'static str, Arc<Mutex<Vec<String>>>);

#[async_trait]
impl Middleware for Record {
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        self.1.lock().unwrap().push(format!("{} in", self.0));
        let r = next.run(envelope).await;
        self.1.lock().unwrap().push(format!("{} out", self.0));
        r
    }
}

#[tokio::test]
async fn user_middleware_runs_in_list_order_around_the_handler() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let bus = MessageBus::builder()
        .middleware(Record("first", log.clone()))
        .middleware(Record("second", log.clone()))
        .handler_fn("h", move |_: Arc<Order>| {
            l.lock().unwrap().push("handler".into());
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    bus.dispatch(Order(1)).await.unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "first in",
            "second in",
            "handler",
            "second out",
            "first out"
        ]
    );
}

#[tokio::test]
async fn several_named_buses_stamp_their_name() {
    let commands = MessageBus::builder()
        .name("command.bus")
        .handler_fn("a", counting(&counter()))
        .build();
    let env = commands.dispatch(Order(1)).await.unwrap();
    assert_eq!(
        env.last::<BusNameStamp>().map(|b| b.0.as_str()),
        Some("command.bus")
    );
}

#[tokio::test]
async fn dispatch_after_current_bus_waits_for_success_and_is_dropped_on_failure() {
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let mails = InMemoryTransport::new();
    let link = courier_core::BusLink::new();
    let (l1, l2) = (log.clone(), log.clone());
    let link2 = link.clone();
    let bus = MessageBus::builder()
        .transport("mail", Arc::new(mails.clone()))
        .route("mail.*", ["mail"])
        .handler_fn("order", move |o: Arc<Order>| {
            let (log, link) = (l1.clone(), link2.clone());
            async move {
                let bus = link.get().unwrap();
                bus.dispatch(Envelope::new(Mail(o.0)).with(DispatchAfterCurrentBusStamp))
                    .await
                    .unwrap();
                log.lock().unwrap().push(format!("order {} handled", o.0));
                if o.0 == 2 {
                    Err(HandlerError::msg("order failed"))
                } else {
                    Ok(())
                }
            }
        })
        .handler_fn("after", move |_: Arc<Order>| {
            l2.lock().unwrap().push("second handler".into());
            async { Ok::<(), HandlerError>(()) }
        })
        .link(link)
        .build();
    bus.dispatch(Order(1)).await.unwrap();
    assert_eq!(mails.sent().len(), 1, "sent once the order was handled");
    assert!(!mails.sent()[0].has::<DispatchAfterCurrentBusStamp>());
    bus.dispatch(Order(2)).await.unwrap_err();
    assert_eq!(mails.sent().len(), 1, "dropped because the order failed");
    assert_eq!(log.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn a_message_from_the_failure_transport_is_treated_as_received_from_its_original() {
    let seen = Arc::new(Mutex::new(String::new()));
    let s = seen.clone();
    struct Capture(Arc<Mutex<String>>);
    #[async_trait]
    impl Middleware for Capture {
        async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
            *self.0.lock().unwrap() = envelope
                .last::<ReceivedStamp>()
                .map(|r| r.0.clone())
                .unwrap_or_default();
            next.run(envelope).await
        }
    }
    let bus = MessageBus::builder()
        .middleware(Capture(s))
        .handler_fn("a", counting(&counter()))
        .build();
    let env = Envelope::new(Order(1))
        .with(SentToFailureTransportStamp::new("async"))
        .with(ReceivedStamp("failed".into()));
    bus.dispatch(env).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), "async");
}

#[tokio::test]
async fn sync_transport_handles_on_dispatch_and_ignores_delay() {
    let a = counter();
    let bus = MessageBus::builder()
        .sync_transport("sync")
        .route("*", ["sync"])
        .handler_fn("a", counting(&a))
        .build();
    let env = Envelope::new(Order(1)).with(courier_core::DelayStamp(
        std::time::Duration::from_secs(3600),
    ));
    bus.dispatch(env).await.unwrap();
    assert_eq!(a.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn sync_transport_retries_in_process_then_uses_the_failure_transport() {
    let calls = counter();
    let c = calls.clone();
    let failed = InMemoryTransport::new();
    let link = courier_core::BusLink::new();
    let sync = courier_core::SyncTransport::new("sync", link.clone())
        .retry_strategy(Arc::new(MultiplierRetryStrategy::default().max_retries(2)))
        .failure_transport(Some("failed".into()));
    let bus = MessageBus::builder()
        .transport("sync", Arc::new(sync))
        .transport("failed", Arc::new(failed.clone()))
        .route("shop.*", ["sync"])
        .handler_fn("h", move |_: Arc<Order>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(HandlerError::msg("down")) }
        })
        .link(link)
        .build();
    bus.dispatch(Order(1)).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "1 try + 2 retries");
    let moved = failed.sent();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0]
            .last::<SentToFailureTransportStamp>()
            .map(|s| s.original.as_str()),
        Some("sync")
    );
    assert_eq!(moved[0].all::<courier_core::ErrorDetailsStamp>().count(), 3);
}

#[tokio::test]
async fn sync_transport_without_failure_transport_returns_the_error() {
    let bus = MessageBus::builder()
        .sync_transport("sync")
        .route("*", ["sync"])
        .handler_fn("h", |_: Arc<Order>| async {
            Err::<(), _>(HandlerError::unrecoverable("bad order"))
        })
        .build();
    let err = bus.dispatch(Order(1)).await.unwrap_err();
    assert_eq!(err.handler_failures().len(), 1);
    assert!(
        err.handler_failures()[0]
            .error
            .to_string()
            .contains("bad order")
    );
    let transport = bus.transport("sync").unwrap();
    assert!(transport.get(10).await.unwrap().is_empty());
}

mod handler_options {
    use std::sync::{Arc, Mutex};

    use courier_core::{
        BusError, Envelope, HandlerError, HandlerOptions, Message, MessageBus, ReceivedStamp,
    };
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Placed(u32);
    impl Message for Placed {
        const NAME: &'static str = "orders.placed";
    }

    type Log = Arc<Mutex<Vec<&'static str>>>;

    fn logging(
        log: &Log,
        name: &'static str,
    ) -> impl Fn(Arc<Placed>) -> std::future::Ready<Result<(), HandlerError>> + Send + Sync + 'static
    {
        let log = log.clone();
        move |_| {
            log.lock().unwrap().push(name);
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn handlers_run_highest_priority_first_then_in_registration_order() {
        let log = Log::default();
        let bus = MessageBus::builder()
            .handler_fn_with(HandlerOptions::new("low"), logging(&log, "low"))
            .handler_fn_with(
                HandlerOptions::new("high").priority(10),
                logging(&log, "high"),
            )
            .handler_fn_with(HandlerOptions::new("low2"), logging(&log, "low2"))
            .handler_fn_with(
                HandlerOptions::new("neg").priority(-5),
                logging(&log, "neg"),
            )
            .build();
        bus.dispatch(Placed(1)).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["high", "low", "low2", "neg"]);
    }

    #[tokio::test]
    async fn a_from_transport_handler_runs_only_for_messages_received_from_that_transport() {
        let log = Log::default();
        let bus = MessageBus::builder()
            .handler_fn_with(HandlerOptions::new("any"), logging(&log, "any"))
            .handler_fn_with(
                HandlerOptions::new("orders-only").from_transport("orders"),
                logging(&log, "orders-only"),
            )
            .build();
        bus.dispatch(Envelope::new(Placed(1)).with(ReceivedStamp("orders".into())))
            .await
            .unwrap();
        bus.dispatch(Envelope::new(Placed(2)).with(ReceivedStamp("other".into())))
            .await
            .unwrap();
        bus.dispatch(Placed(3)).await.unwrap();
        assert_eq!(*log.lock().unwrap(), ["any", "orders-only", "any", "any"]);
    }

    #[tokio::test]
    async fn no_applicable_handler_is_an_error_unless_the_bus_allows_no_handlers() {
        let log = Log::default();
        let strict = MessageBus::builder()
            .handler_fn_with(
                HandlerOptions::new("orders-only").from_transport("orders"),
                logging(&log, "orders-only"),
            )
            .build();
        let err = strict.dispatch(Placed(1)).await.unwrap_err();
        assert!(matches!(err, BusError::NoHandler { .. }), "{err}");
        let lenient = MessageBus::builder()
            .message::<Placed>()
            .allow_no_handlers(true)
            .build();
        lenient.dispatch(Placed(2)).await.unwrap();
        assert!(log.lock().unwrap().is_empty());
    }
}
