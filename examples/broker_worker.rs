//! Dispatch to a broker chosen by DSN and consume with a worker. Needs the server and its feature:
//!
//! ```text
//! COURIER_DSN=redis://127.0.0.1:6379?stream=courier_example cargo run --example broker_worker --features redis
//! COURIER_DSN='amqp://guest:guest@127.0.0.1:5672/%2f?exchange=courier_example' cargo run --example broker_worker --features amqp
//! ```
//!
//! Any DSN the build supports works the same way (`sqlite://`, `postgres://`, ...).
use std::sync::Arc;
use std::time::Duration;

use courier::{
    CancellationToken, Dsn, FactoryContext, HandlerError, Message, MessageBus, MessageRegistry,
    Worker,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct ResizeImage {
    path: String,
}

impl Message for ResizeImage {
    const NAME: &'static str = "media.resize";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dsn = Dsn::parse(
        &std::env::var("COURIER_DSN").unwrap_or_else(|_| "sqlite://courier-example.db".into()),
    )?;
    println!("using {dsn}"); // the password is redacted
    let registry = Arc::new(MessageRegistry::new().with::<ResizeImage>());
    let queue = courier::transport_registry()
        .create(FactoryContext::new("images", dsn).registry(registry))
        .await?;
    if let Some(setup) = queue.as_setup() {
        setup.setup().await?;
    }
    let bus = MessageBus::builder()
        .transport("images", queue.clone())
        .route("media.*", ["images"])
        .handler_fn("resize", |m: Arc<ResizeImage>| async move {
            println!("resizing {}", m.path);
            Ok::<(), HandlerError>(())
        })
        .build();
    for i in 0..3 {
        bus.dispatch(ResizeImage {
            path: format!("photo-{i}.jpg"),
        })
        .await?;
    }
    let stats = Worker::builder(bus)
        .receiver("images", queue)
        .limit(3)
        .time_limit(Duration::from_secs(10))
        .build()
        .run(CancellationToken::new())
        .await?;
    println!("handled {}", stats.handled);
    Ok(())
}
