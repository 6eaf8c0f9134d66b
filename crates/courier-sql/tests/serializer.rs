//! MessagePack bodies on SQL (`serializer=msgpack`): every stamp kind survives the round trip
//! with the body stored as base64 MessagePack, and a queue holding JSON and MessagePack rows is
//! consumed whole.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use courier_core::{Envelope, Transport};
use courier_test::{TestMessage, conformance, serializer};

async fn msgpack(mut h: common::SqlHarness) {
    h.extra.push_str("&serializer=msgpack");
    conformance::round_trip(&h).await;
    let (t, table) = h.make("").await;
    t.send(Envelope::new(TestMessage::new(1))).await.unwrap();
    // `count` counts the rows of what follows `FROM`.
    let stored =
        format!("{table} WHERE headers LIKE '%application/msgpack%' AND body NOT LIKE '{{%'");
    assert_eq!(h.admin.count(&stored).await, 1, "stored as MessagePack");
    serializer::json_and_msgpack_producers_are_both_consumed(&h).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_msgpack_round_trip_and_mixed_queue() {
    msgpack(common::sqlite().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_msgpack_round_trip_and_mixed_queue() {
    msgpack(common::postgres().await).await;
}
