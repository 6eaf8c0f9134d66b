//! Dispatch a message, consume it with a worker: all in memory. `cargo run --example quickstart`
use std::sync::Arc;

use courier::{CancellationToken, HandlerError, InMemoryTransport, Message, MessageBus, Worker};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct SendWelcomeEmail {
    to: String,
}

impl Message for SendWelcomeEmail {
    const NAME: &'static str = "mail.send_welcome";
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let queue = Arc::new(InMemoryTransport::new());
    let bus = MessageBus::builder()
        .transport("async", queue.clone())
        .route("mail.*", ["async"])
        .handler_fn("send_welcome", |m: Arc<SendWelcomeEmail>| async move {
            println!("welcome mail sent to {}", m.to);
            Ok::<(), HandlerError>(())
        })
        .build();

    bus.dispatch(SendWelcomeEmail {
        to: "ada@example.com".into(),
    })
    .await?;
    let worker = Worker::builder(bus)
        .receiver("async", queue)
        .limit(1)
        .build();
    let stats = worker.run(CancellationToken::new()).await?;
    println!("handled {} message(s)", stats.handled);
    Ok(())
}
