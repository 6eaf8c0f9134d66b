//! Signed messages on SQL: rows with a body changed by one byte in the database, a changed
//! stamp header, no signature, or a signature by an unknown key end in the failure transport
//! with the reason named, and are never handled; rows signed before a key rotation still verify.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use courier_core::{
    CancellationToken, ErrorDetailsStamp, HandlerError, MessageBus, Signing, SigningKeys, Worker,
};
use courier_test::{TestMessage, signing};

async fn scenario(h: common::SqlHarness) {
    signing::tampered_messages_end_in_the_failure_transport(&h).await;
}

/// A row's body changed in place by one byte (`UPDATE ... SET body = REPLACE(...)`).
async fn body_changed_in_the_database(h: common::SqlHarness) {
    let (queue, table) = h.make("").await;
    let (failed, _) = h.make("&queue_name=failed").await;
    signing::producer(&[signing::NEW_KEY], queue.clone())
        .dispatch(TestMessage::new(7))
        .await
        .unwrap();
    let changed = h
        .admin
        .exec(
            &format!("UPDATE {table} SET body = REPLACE(body, 'message 7', 'massage 7')"),
            &[],
        )
        .await;
    assert_eq!(changed, 1);
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = handled.clone();
    let bus = MessageBus::builder()
        .messages(courier_test::registry())
        .signing(
            Signing::new(SigningKeys::new([signing::NEW_KEY]).unwrap()).messages(["courier.*"]),
        )
        .handler_fn("count", move |_: Arc<TestMessage>| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<(), HandlerError>(()) }
        })
        .build();
    tokio::time::timeout(
        Duration::from_secs(30),
        Worker::builder(bus)
            .receiver("queue", queue)
            .failure_transport("failed", failed.clone())
            .limit(1)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 0);
    let moved = courier_core::Listable::list(&*failed, 10).await.unwrap();
    assert_eq!(moved.len(), 1);
    let details = moved[0].last::<ErrorDetailsStamp>().unwrap();
    assert_eq!(details.class, "signature");
    assert!(
        details.chain.join(" ").contains("does not match"),
        "{details:?}"
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tampered_unsigned_and_unknown_key_messages_end_in_the_failure_transport() {
    scenario(common::sqlite().await).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_body_changed_in_the_database_is_refused() {
    body_changed_in_the_database(common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_tampered_unsigned_and_unknown_key_messages_end_in_the_failure_transport() {
    scenario(common::postgres().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_a_body_changed_in_the_database_is_refused() {
    body_changed_in_the_database(common::postgres().await).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn mysql_tampered_unsigned_and_unknown_key_messages_end_in_the_failure_transport() {
    scenario(common::mysql().await).await;
}
