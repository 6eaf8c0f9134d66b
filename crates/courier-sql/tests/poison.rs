//! SQLite rows no producer should write (a body stored as text that is not UTF-8, a BLOB, an
//! integer) never fail a claim: the batch they are in is delivered, each bad row as an
//! undecodable envelope keeping its bytes; the worker moves each to the failure transport as it
//! was stored, and `failed retry` cannot make it valid. And a claim that does fail names its
//! cause.

#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    BODY_ENCODING_HEADER, CancellationToken, DelayStamp, DeliveryTagStamp, Encoded, Envelope,
    ErrorDetailsStamp, HandlerError, Listable, MessageBus, MessageCount, ReceivedStamp,
    RedeliveryStamp, SentToFailureTransportStamp, Transport, TransportErrorKind,
    TransportMessageIdStamp, Worker, encode, error_chain,
};
use courier_sql::SqlTransport;
use courier_test::TestMessage;

async fn timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("operation timed out")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rows_of_every_bad_kind_leave_the_rest_of_their_batch_deliverable() {
    let h = common::sqlite().await;
    let (t, table) = h.make("").await;
    let now = h.admin.now();
    let headers = courier_test::POISON_HEADERS;
    let q = t.options().queue();
    timeout(t.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    for body in [
        "CAST(X'FF7B7D' AS TEXT)", // text that is not UTF-8
        "X'FF7B7D'",               // a BLOB
        "X'7B7D'",                 // a BLOB holding text
        "42",                      // an integer
        "4.5",                     // a real
    ] {
        let sql = format!(
            "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
             VALUES (?, {body}, ?, 0, {now}, {now})"
        );
        h.admin.exec(&sql, &[q, headers]).await;
    }
    let sql = format!(
        "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
         VALUES (?, '{{\"seq\":2,\"text\":\"x\"}}', CAST(X'7B22FF22' AS TEXT), 0, {now}, {now})"
    );
    h.admin.exec(&sql, &[q]).await;
    timeout(t.send(Envelope::new(TestMessage::new(3))))
        .await
        .unwrap();

    let got = timeout(t.get(20)).await.unwrap();
    assert_eq!(got.len(), 8, "the whole batch is claimed in one get");
    let good: Vec<u64> = got
        .iter()
        .filter_map(|e| e.message::<TestMessage>().map(|m| m.seq))
        .collect();
    assert_eq!(good, vec![1, 3], "the good rows decode");
    let bodies: Vec<&[u8]> = got
        .iter()
        .filter(|e| e.decode_error().is_some())
        .map(|e| e.undecodable_body().unwrap())
        .collect();
    assert_eq!(
        bodies,
        vec![
            &b"\xff{}"[..],
            b"\xff{}",
            b"{}",
            b"42",
            b"4.5",
            br#"{"seq":2,"text":"x"}"#
        ],
        "each bad row keeps its bytes"
    );
    timeout(t.ack_batch(&got)).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0, "acked for good");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fails_carries_the_driver_error_as_its_source() {
    let h = common::sqlite().await;
    let (t, table) = h.make("").await;
    h.admin.exec(&format!("DROP TABLE {table}"), &[]).await;
    let err = timeout(t.get(1)).await.unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Protocol);
    assert_eq!(err.context(), Some("claiming messages"));
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        source
            .as_deref()
            .is_some_and(|s| s.contains("no such table")),
        "the driver error is the source: {source:?}"
    );
    let shown = error_chain(&err).to_string();
    assert!(
        shown.contains("claiming messages") && shown.contains("no such table"),
        "{shown}"
    );
}

/// The envelope as `courier failed retry` sends it back to its transport.
fn fresh(e: Envelope) -> Envelope {
    e.without_all::<SentToFailureTransportStamp>()
        .without_all::<TransportMessageIdStamp>()
        .without_all::<DeliveryTagStamp>()
        .without_all::<ReceivedStamp>()
        .without_all::<DelayStamp>()
        .without_all::<RedeliveryStamp>()
}

/// Runs a worker on `t` (failures to `failed`) until it has received `n` messages; returns
/// the sequence numbers handled and how many went to the failure transport.
async fn consume(t: &Arc<SqlTransport>, failed: &Arc<SqlTransport>, n: u64) -> (Vec<u64>, u64) {
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&handled);
    let bus = MessageBus::builder()
        .handler_fn("record", move |m: Arc<TestMessage>| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(m.seq);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let stats = timeout(
        Worker::builder(bus)
            .receiver("async", t.clone())
            .failure_transport("failed", failed.clone())
            .limit(n)
            .build()
            .run(CancellationToken::new()),
    )
    .await
    .unwrap();
    let mut seqs = handled.lock().unwrap().clone();
    seqs.sort_unstable();
    (seqs, stats.moved_to_failure)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_rows_reach_the_failure_transport_as_stored_and_stay_undecodable_when_retried() {
    let h = common::sqlite().await;
    let (t, table) = h.make("").await;
    let failed = h.reuse_with(&table, "&queue_name=failed").await;
    let now = h.admin.now();
    let q = t.options().queue();
    // Each was handled as valid after `failed retry --all` when the failure transport rewrote
    // headers: a content type that is not JSON, a stamp header that is not a JSON list.
    let poisons = [
        (
            "'{\"seq\":10,\"text\":\"x\"}'",
            r#"{"content-type":"text/plain","type":"courier.test"}"#,
        ),
        (
            "'{\"seq\":11,\"text\":\"x\"}'",
            r#"{"type":"courier.test","x-courier-stamp-redelivery":"{oops"}"#,
        ),
        ("X'FF7B7D'", courier_test::POISON_HEADERS),
    ];
    timeout(t.send(Envelope::new(TestMessage::new(1))))
        .await
        .unwrap();
    for (body, headers) in poisons {
        let sql = format!(
            "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
             VALUES (?, {body}, ?, 0, {now}, {now})"
        );
        h.admin.exec(&sql, &[q, headers]).await;
    }
    timeout(t.send(Envelope::new(TestMessage::new(3))))
        .await
        .unwrap();

    let (handled, moved) = consume(&t, &failed, 5).await;
    assert_eq!(handled, vec![1, 3], "the good messages of the batch run");
    assert_eq!(moved, 3, "each poison row goes to the failure transport");
    assert_eq!(timeout(t.message_count()).await.unwrap(), 0);

    let listed = timeout(failed.list(10)).await.unwrap();
    assert_eq!(listed.len(), 3);
    let bodies: Vec<&[u8]> = vec![
        br#"{"seq":10,"text":"x"}"#,
        br#"{"seq":11,"text":"x"}"#,
        b"\xff{}",
    ];
    for ((e, (_, headers)), body) in listed.iter().zip(poisons).zip(bodies) {
        assert!(e.decode_error().is_some(), "{headers}: still undecodable");
        assert_eq!(
            e.undecodable_body(),
            Some(body),
            "{headers}: the same bytes"
        );
        assert!(
            e.last::<ErrorDetailsStamp>()
                .is_some_and(|d| d.class == "decode")
        );
        assert_eq!(
            e.last::<SentToFailureTransportStamp>()
                .map(|s| s.original.as_str()),
            Some("async")
        );
        let mut stored: BTreeMap<String, String> = Encoded::parse_headers(headers).unwrap();
        if std::str::from_utf8(body).is_err() {
            stored.insert(BODY_ENCODING_HEADER.to_owned(), "base64".to_owned());
        }
        let bare = e
            .clone()
            .without_all::<ErrorDetailsStamp>()
            .without_all::<SentToFailureTransportStamp>();
        assert_eq!(encode(&bare).unwrap().headers, stored, "the same headers");
    }

    // `courier failed retry --all`: back to the original transport, still undecodable.
    for e in listed {
        let id = e.id().unwrap().to_owned();
        timeout(t.send(fresh(e))).await.unwrap();
        assert!(timeout(failed.remove(&id)).await.unwrap());
    }
    let (handled, moved) = consume(&t, &failed, 3).await;
    assert_eq!(handled, Vec::<u64>::new(), "no poison is handled as valid");
    assert_eq!(moved, 3, "each goes back to the failure transport");
}
