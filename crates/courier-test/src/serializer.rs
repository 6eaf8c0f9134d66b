//! Body serializer checks: a queue holding JSON and MessagePack messages is consumed whole,
//! whatever serializer the consuming transport writes with.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    CancellationToken, Envelope, HandlerError, MessageBus, Serializer, Worker, encode_with,
};

use crate::{Harness, TestMessage, registry};

/// A JSON producer and a MessagePack producer (stored with the raw driver), plus the
/// transport's own send, on one queue: a worker handles all three.
///
/// # Panics
/// When a message is not handled, or the worker fails or takes more than 30 s.
pub async fn json_and_msgpack_producers_are_both_consumed(h: &dyn Harness) {
    let t = h.transport().await;
    for (seq, serializer) in [(1, Serializer::Json), (2, Serializer::MessagePack)] {
        let wire = encode_with(&Envelope::new(TestMessage::new(seq)), serializer)
            .expect("encode test message");
        h.send_raw(&t, wire).await;
    }
    tokio::time::timeout(Duration::from_secs(20), t.send(TestMessage::new(3).into()))
        .await
        .expect("send timed out")
        .expect("send");
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = handled.clone();
    let bus = MessageBus::builder()
        .messages(registry())
        .handler_fn("record", move |m: Arc<TestMessage>| {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((m.seq, m.text.clone()));
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        Worker::builder(bus)
            .receiver("queue", t)
            .limit(3)
            .time_limit(Duration::from_secs(25))
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("worker timed out")
    .expect("worker");
    let mut handled = handled.lock().unwrap_or_else(|e| e.into_inner()).clone();
    handled.sort();
    let expected: Vec<(u64, String)> = (1..=3)
        .map(|seq| (seq, TestMessage::new(seq).text))
        .collect();
    assert_eq!(handled, expected, "{stats:?}");
}
