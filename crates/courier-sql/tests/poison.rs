//! SQLite rows no producer should write (a body stored as text that is not UTF-8, a BLOB, an
//! integer) never fail a claim: the batch they are in is delivered, each bad row as an
//! undecodable envelope keeping its bytes. And a claim that does fail names its cause.

#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use courier_core::{Envelope, Transport, TransportErrorKind, error_chain};
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
