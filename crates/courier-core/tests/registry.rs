//! One message registry: the one the application hands its transports is the bus's; a handler
//! reaches the bus handling its message without holding it.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Mutex};

use courier_core::config::Config;
use courier_core::{
    Envelope, HandlerError, Message, MessageBus, MessageRegistry, TransportRegistry,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
struct Order(u32);
impl Message for Order {
    const NAME: &'static str = "shop.order";
}

#[tokio::test]
async fn the_bus_built_over_connected_transports_decodes_with_their_registry() {
    let config: Config = "[transports.async]\ndsn = \"in-memory://?serialize=true\"\n"
        .parse()
        .unwrap();
    let messages = Arc::new(MessageRegistry::new().with::<Order>());
    let transports = config
        .connect(&TransportRegistry::new(), messages.clone())
        .await
        .unwrap();
    assert!(Arc::ptr_eq(transports.messages(), &messages));
    let bus = transports
        .bus_builder()
        .registry(&MessageRegistry::new().with::<Order>())
        .handler_fn("orders", |_: Arc<Order>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    assert!(
        Arc::ptr_eq(bus.registry(), &messages),
        "one registry, not a copy per owner"
    );
}

#[test]
fn a_handler_for_a_type_the_shared_registry_lacks_gives_the_bus_its_own_copy() {
    let messages = Arc::new(MessageRegistry::new());
    let bus = MessageBus::builder()
        .messages(messages.clone())
        .handler_fn("orders", |_: Arc<Order>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    assert!(bus.registry().contains(Order::NAME));
    assert!(!messages.contains(Order::NAME));
}

#[tokio::test]
async fn a_handler_sees_the_bus_handling_its_message() {
    assert!(MessageBus::current().is_none());
    let seen = Arc::new(Mutex::new(None));
    let in_handler = seen.clone();
    let bus = MessageBus::builder()
        .name("shop")
        .handler_fn("orders", move |_: Arc<Order>| {
            let name = MessageBus::current().map(|b| b.name().to_owned());
            *in_handler.lock().unwrap() = name;
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    bus.dispatch(Envelope::new(Order(1))).await.unwrap();
    assert_eq!(seen.lock().unwrap().as_deref(), Some("shop"));
    assert!(MessageBus::current().is_none());
}
