//! A SQLite outbox relayed into NATS: every message arrives once, with the message id and the
//! stamps it was dispatched with, and the outbox is left empty.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{NatsHarness, OP};
use courier_core::relay::{Relay, RelayOptions};
use courier_core::{
    BusNameStamp, CancellationToken, Dsn, Envelope, MessageBus, MessageIdStamp, TraceContextStamp,
    Transport,
};
use courier_sql::SqlTransport;
use courier_test::TestMessage;

const MESSAGES: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats: set COURIER_TEST_NATS_URL"]
async fn a_sqlite_outbox_relays_into_nats_once_with_ids_and_stamps() {
    let h = NatsHarness::new().await;
    let nats = h
        .make(NatsHarness::options(&NatsHarness::unique("courier_relay")))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let dsn = Dsn::parse(&format!(
        "sqlite://{}?queue_name=outbox",
        dir.path().join("outbox.db").display()
    ))
    .unwrap();
    let outbox: Arc<dyn Transport> = Arc::new(
        tokio::time::timeout(
            OP,
            SqlTransport::connect("outbox", &dsn, courier_test::registry()),
        )
        .await
        .expect("sqlite connect timed out")
        .expect("sqlite outbox"),
    );
    let bus = MessageBus::builder()
        .transport("outbox", outbox.clone())
        .route("courier.test", ["outbox"])
        .message::<TestMessage>()
        .build();
    let mut written = BTreeMap::new();
    for seq in 0..MESSAGES {
        let trace = TraceContextStamp {
            traceparent: format!("00-{:032x}-{:016x}-01", seq + 1, seq + 1),
            tracestate: Some(format!("courier=relay{seq}")),
        };
        let sent = tokio::time::timeout(
            OP,
            bus.dispatch(Envelope::new(TestMessage::new(seq)).with(trace)),
        )
        .await
        .expect("dispatch timed out")
        .expect("dispatch");
        written.insert(seq, sent);
    }

    let relay = Relay::new("outbox", outbox.clone(), "nats", nats.clone())
        .options(RelayOptions::default().batch_size(16).limit(Some(MESSAGES)));
    let stats = tokio::time::timeout(Duration::from_secs(60), relay.run(CancellationToken::new()))
        .await
        .expect("relay timed out")
        .expect("relay");
    assert_eq!(stats.relayed, MESSAGES);
    let left = outbox.as_message_count().expect("sql counts");
    assert_eq!(
        tokio::time::timeout(OP, left.message_count())
            .await
            .unwrap()
            .unwrap(),
        0,
        "the outbox is empty after the relay"
    );

    let mut got: BTreeMap<u64, Vec<Envelope>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.values().map(Vec::len).sum::<usize>() < MESSAGES as usize
        && tokio::time::Instant::now() < deadline
    {
        let batch = tokio::time::timeout(OP, nats.get(32))
            .await
            .unwrap()
            .unwrap();
        tokio::time::timeout(OP, nats.ack_batch(&batch))
            .await
            .unwrap()
            .unwrap();
        for e in batch {
            let seq = e.message::<TestMessage>().expect("decoded").seq;
            got.entry(seq).or_default().push(e);
        }
    }
    let extra = tokio::time::timeout(OP, nats.get(10))
        .await
        .unwrap()
        .unwrap();
    assert!(extra.is_empty(), "{} message(s) arrived twice", extra.len());
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (0..MESSAGES).collect::<Vec<_>>(),
        "every message arrives"
    );
    for (seq, envelopes) in &got {
        assert_eq!(envelopes.len(), 1, "message {seq} arrived once");
        let (got, written) = (&envelopes[0], &written[seq]);
        assert_eq!(
            got.last::<MessageIdStamp>(),
            Some(
                written
                    .last::<MessageIdStamp>()
                    .expect("the bus adds an id")
            ),
            "message {seq}: the same id"
        );
        assert_eq!(got.all::<MessageIdStamp>().count(), 1, "one id, not two");
        assert_eq!(
            got.last::<TraceContextStamp>(),
            written.last::<TraceContextStamp>()
        );
        assert!(got.has::<BusNameStamp>());
        assert_eq!(got.last::<BusNameStamp>(), written.last::<BusNameStamp>());
    }
    let count = nats.abilities().message_count.expect("nats counts");
    assert_eq!(
        tokio::time::timeout(OP, count.message_count())
            .await
            .unwrap()
            .unwrap(),
        0
    );
}
