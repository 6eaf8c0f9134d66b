//! The signed-messages scenario every transport runs: messages tampered with in storage,
//! unsigned, or signed with an unknown key end in the failure transport with the reason named
//! and are never handled; messages signed with the old key still verify after rotation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    CancellationToken, Encoded, ErrorDetailsStamp, HandlerError, InMemoryTransport, MessageBus,
    Signing, SigningKeys, Transport, Worker, encode,
};

use crate::{Harness, TestMessage, registry};

/// The key messages were signed with before the rotation.
pub const OLD_KEY: &str = "courier-test-old-signing-key-0123456789";
/// The key that signs after the rotation.
pub const NEW_KEY: &str = "courier-test-new-signing-key-0123456789";
/// A key the consumer does not have.
pub const UNKNOWN_KEY: &str = "courier-test-someone-elses-key-012345678";

fn keys(list: &[&str]) -> SigningKeys {
    SigningKeys::new(list.iter().copied()).expect("test keys are long enough")
}

/// A bus that signs `courier.*` with `keys` and routes it to `transport`.
#[must_use]
pub fn producer(keys_text: &[&str], transport: Arc<dyn Transport>) -> MessageBus {
    MessageBus::builder()
        .messages(registry())
        .transport("queue", transport)
        .route("courier.*", ["queue"])
        .signing(Signing::new(keys(keys_text)).messages(["courier.*"]))
        .build()
}

/// The wire form a producer signing with `keys` gives message `seq`.
async fn signed_wire(keys_text: &[&str], seq: u64) -> Encoded {
    let capture = InMemoryTransport::new();
    let bus = producer(keys_text, Arc::new(capture.clone()));
    bus.dispatch(TestMessage::new(seq))
        .await
        .expect("dispatch to memory");
    encode(&capture.sent()[0]).expect("encode")
}

async fn timed<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out"))
}

const OP: Duration = Duration::from_secs(20);

/// Runs the scenario on two fresh queues of `h` (the queue and its failure transport).
///
/// # Panics
/// When a tampered message was handled, a valid one was not, or a failed message does not
/// name its reason.
pub async fn tampered_messages_end_in_the_failure_transport(h: &dyn Harness) {
    let queue = h.transport().await;
    let failed = h.transport().await;

    // Signed before the rotation, and after it: both must be handled.
    for (keys_text, seq) in [(&[OLD_KEY][..], 1), (&[NEW_KEY, OLD_KEY][..], 2)] {
        timed(
            "dispatch",
            OP,
            producer(keys_text, queue.clone()).dispatch(TestMessage::new(seq)),
        )
        .await
        .expect("dispatch");
    }
    // Stored with the raw driver, as an attacker with database access would.
    let mut body = signed_wire(&[NEW_KEY], 3).await;
    let changed = body.body.replacen("message 3", "massage 3", 1);
    assert_eq!(changed.len(), body.body.len());
    body.body = changed;
    let mut stamp = signed_wire(&[NEW_KEY], 4).await;
    stamp
        .headers
        .insert("x-courier-stamp-bus-name".into(), r#"["other"]"#.into());
    let mut unsigned = signed_wire(&[NEW_KEY], 5).await;
    assert!(
        unsigned
            .headers
            .remove("x-courier-stamp-signature")
            .is_some()
    );
    let unknown = signed_wire(&[UNKNOWN_KEY], 6).await;
    for wire in [body, stamp, unsigned, unknown] {
        timed("send_raw", OP, h.send_raw(&queue, wire)).await;
    }

    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = handled.clone();
    let bus = MessageBus::builder()
        .messages(registry())
        .signing(Signing::new(keys(&[NEW_KEY, OLD_KEY])).messages(["courier.*"]))
        .handler_fn("record", move |m: Arc<TestMessage>| {
            seen.lock().unwrap_or_else(|e| e.into_inner()).push(m.seq);
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    let stats = timed(
        "worker",
        Duration::from_secs(60),
        Worker::builder(bus)
            .receiver("queue", queue.clone())
            .failure_transport("failed", failed.clone())
            .limit(6)
            .time_limit(Duration::from_secs(45))
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .expect("worker");
    let mut handled = handled.lock().unwrap_or_else(|e| e.into_inner()).clone();
    handled.sort_unstable();
    assert_eq!(
        handled,
        [1, 2],
        "only the valid messages are handled ({stats:?})"
    );

    let listed = timed(
        "list",
        OP,
        failed
            .as_listable()
            .expect("failure transport is listable")
            .list(10),
    )
    .await
    .expect("list");
    let reasons: BTreeMap<u64, (String, String)> = listed
        .iter()
        .map(|e| {
            let seq = e.message::<TestMessage>().expect("decodes").seq;
            let d: &ErrorDetailsStamp = e.last().expect("error details");
            (seq, (d.class.clone(), d.chain.join(" / ")))
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    for (seq, reason) in [
        (3, "does not match"),
        (4, "does not match"),
        (5, "not signed"),
        (6, "unknown key"),
    ] {
        let (class, chain) = &reasons[&seq];
        assert_eq!(class, "signature", "message {seq}");
        assert!(chain.contains(reason), "message {seq}: {chain}");
    }
    let queue_left = queue.as_message_count().map(|c| c.message_count());
    if let Some(count) = queue_left {
        assert_eq!(count.await.expect("count"), 0, "the queue is drained");
    }
}
