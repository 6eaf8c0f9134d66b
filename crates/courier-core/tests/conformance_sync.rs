//! The conformance items as they apply to [`SyncTransport`](courier_core::SyncTransport), which handles every
//! message on its bus at `send` time and stores nothing.
//!
//! The shared suite (`courier_test::conformance_suite!`) cannot run on it: every case
//! receives what it sent through `get`, and a sync transport's `get` always returns nothing.
//! The items are therefore checked here in their in-process form:
//!
//! | item | on SyncTransport | test |
//! |---|---|---|
//! | 1 round trip | the handler gets the message exactly (unicode, 1 MiB); `send` returns the envelope with every stamp plus a `HandledStamp` | `send_handles_the_exact_message_in_process`, `a_one_mib_message_is_handled_intact` |
//! | 2 ack / reject | nothing is stored: `get` is empty, `ack` / `reject` (twice, batched) are harmless no-ops | `get_is_empty_and_ack_reject_are_harmless` |
//! | 3 delay | **documented exception**: `DelayStamp` is ignored (handled at once), not refused | `delay_stamp_is_ignored_not_refused` |
//! | 4 order | messages are handled in send order | `messages_are_handled_in_send_order` |
//! | 5 redelivery | does not apply: nothing is delivered, so nothing is redelivered; `keepalive` is a no-op | `get_is_empty_and_ack_reject_are_harmless` |
//! | 6 concurrency | concurrent senders: every message handled exactly once | `concurrent_sends_are_each_handled_once` |
//! | 7 retry | `retry` handles again at once (delay ignored); a failing handler is retried in-process up to the strategy's limit, then the error reaches the caller | `retry_handles_again_at_once`, `a_failing_handler_is_retried_in_process_then_reported` |
//! | 8 setup / count / list | does not apply: no `as_setup`, `as_message_count`, `as_listable` (nothing is stored) | `has_no_storage_abilities` |
//! | 9 undecodable | does not apply: messages never leave the process, so nothing is decoded | — |
//! | 10 connection loss | does not apply: there is no connection | — |
//! | batch | `send_batch` handles each in order and returns them in order; `ack_batch` is a no-op | `send_batch_handles_each_in_order` |

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier_core::{
    DelayStamp, Envelope, HandledStamp, HandlerError, MessageBus, RedeliveryStamp, Transport,
    TransportError, TransportErrorKind, encode,
};
use courier_test::TestMessage;
use courier_test::conformance::{UNICODE_TEXT, fully_stamped};

/// Every await in these tests is bounded: a broken transport fails instead of hanging.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(10), fut).await {
        Ok(v) => v,
        Err(_) => panic!("`{what}` did not finish within 10 s"),
    }
}

async fn ok<T>(what: &str, fut: impl Future<Output = Result<T, TransportError>>) -> T {
    match within(what, fut).await {
        Ok(v) => v,
        Err(e) => panic!("`{what}` failed: {e}"),
    }
}

/// A bus with a sync transport `sync` that `courier.test` is routed to, and a handler that
/// records every message it gets (failing the first `fail` calls).
struct Fixture {
    bus: MessageBus,
    seen: Arc<Mutex<Vec<TestMessage>>>,
}

impl Fixture {
    fn new(fail: usize, error: fn() -> HandlerError) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let bus = MessageBus::builder()
            .sync_transport("sync")
            .route("courier.test", ["sync"])
            .handler_fn("record", move |m: Arc<TestMessage>| {
                let record = Arc::clone(&record);
                async move {
                    let mut seen = record.lock().unwrap_or_else(PoisonError::into_inner);
                    seen.push((*m).clone());
                    if seen.len() <= fail {
                        Err(error())
                    } else {
                        Ok(())
                    }
                }
            })
            .build();
        Self { bus, seen }
    }

    fn ok_handler() -> Self {
        Self::new(0, || HandlerError::msg("unused"))
    }

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::clone(
            self.bus
                .transport("sync")
                .expect("the bus has the sync transport"),
        )
    }

    fn seen(&self) -> Vec<TestMessage> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn seqs(&self) -> Vec<u64> {
        self.seen().iter().map(|m| m.seq).collect()
    }
}

fn message(seq: u64) -> Envelope {
    Envelope::new(TestMessage::new(seq))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_handles_the_exact_message_in_process() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    let envelope = fully_stamped(1, UNICODE_TEXT);
    let handled = ok("send", t.send(envelope.clone())).await;
    assert_eq!(
        f.seen(),
        vec![TestMessage {
            seq: 1,
            text: UNICODE_TEXT.into()
        }],
        "the handler must get the exact message"
    );
    // Every stamp sent is still there, plus this handler's HandledStamp.
    let handled_by: Vec<&str> = handled
        .all::<HandledStamp>()
        .map(|h| h.handler.as_str())
        .collect();
    assert_eq!(handled_by, vec!["first", "second", "record"]);
    let sent = encode(&envelope).expect("encode sent");
    let back = encode(&handled.without_all::<HandledStamp>()).expect("encode handled");
    let mut expected =
        encode(&envelope.without_all::<HandledStamp>()).expect("encode sent without handled");
    expected
        .headers
        .retain(|k, _| k != "x-courier-stamp-handled");
    assert_eq!(back.body, sent.body, "the body must be unchanged");
    assert_eq!(
        back.headers, expected.headers,
        "every other stamp must be unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mib_message_is_handled_intact() {
    let f = Fixture::ok_handler();
    let text = "abc déf 日本 😀 ".repeat(60_000);
    ok(
        "send (1 MiB)",
        f.transport().send(Envelope::new(TestMessage {
            seq: 2,
            text: text.clone(),
        })),
    )
    .await;
    let seen = f.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].text == text,
        "the 1 MiB text changed ({} bytes vs {} sent)",
        seen[0].text.len(),
        text.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_empty_and_ack_reject_are_harmless() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    let handled = ok("send", t.send(message(1))).await;
    assert!(
        ok("get", t.get(10)).await.is_empty(),
        "a sync transport stores nothing to get"
    );
    ok("ack", t.ack(&handled)).await;
    ok("ack (again)", t.ack(&handled)).await;
    ok("reject", t.reject(&handled)).await;
    ok("reject (again)", t.reject(&handled)).await;
    ok("keepalive", t.keepalive(&handled)).await;
    ok("ack_batch", t.ack_batch(&[handled.clone(), handled])).await;
    assert_eq!(f.seqs(), vec![1], "acks must not handle anything again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_stamp_is_ignored_not_refused() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    assert!(
        t.capabilities().delay,
        "sync declares delay so the capability check does not refuse it"
    );
    let start = tokio::time::Instant::now();
    ok(
        "send (delayed 1 h)",
        t.send(message(1).with(DelayStamp(Duration::from_secs(3600)))),
    )
    .await;
    assert_eq!(
        f.seqs(),
        vec![1],
        "a delayed message is handled at once, in-process"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "sync must not wait for the delay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_handled_in_send_order() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    for s in 0..20 {
        ok("send", t.send(message(s))).await;
    }
    assert_eq!(f.seqs(), (0..20).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_are_each_handled_once() {
    let f = Fixture::ok_handler();
    let tasks: Vec<_> = (0..4u64)
        .map(|p| {
            let t = f.transport();
            tokio::spawn(async move {
                for i in 0..50 {
                    t.send(message(p * 50 + i)).await?;
                }
                Ok::<(), TransportError>(())
            })
        })
        .collect();
    for task in tasks {
        within("sender", task)
            .await
            .expect("sender task panicked")
            .expect("send failed");
    }
    let mut seqs = f.seqs();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (0..200).collect::<Vec<_>>(),
        "every message handled exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_handles_again_at_once() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    let handled = ok("send", t.send(message(1))).await;
    // As a worker would retry after a failure: without the failed handler's HandledStamp.
    let failed = handled
        .clone()
        .without_all::<HandledStamp>()
        .with(RedeliveryStamp::new(1));
    ok(
        "retry (delay ignored)",
        t.retry(failed, Duration::from_secs(3600)),
    )
    .await;
    assert_eq!(
        f.seqs(),
        vec![1, 1],
        "retry must handle the message again, at once"
    );
    // A handler that already succeeded (HandledStamp) is skipped on retry.
    ok("retry (already handled)", t.retry(handled, Duration::ZERO)).await;
    assert_eq!(
        f.seqs(),
        vec![1, 1],
        "a retry must skip handlers that already succeeded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_retried_in_process_then_reported() {
    let f = Fixture::new(usize::MAX, || HandlerError::msg("always fails"));
    let err = match within("send", f.transport().send(message(1))).await {
        Ok(_) => {
            panic!("a handler that always fails must make send fail without a failure transport")
        }
        Err(e) => e,
    };
    assert_eq!(err.kind(), TransportErrorKind::Handler, "{err}");
    assert_eq!(
        f.seqs(),
        vec![1; 4],
        "one attempt plus the default strategy's 3 retries"
    );

    let f = Fixture::new(2, || HandlerError::msg("fails twice"));
    ok(
        "send (fails twice, then succeeds)",
        f.transport().send(message(2)),
    )
    .await;
    assert_eq!(f.seqs(), vec![2; 3]);

    let f = Fixture::new(usize::MAX, || HandlerError::unrecoverable("never retry"));
    assert!(
        within("send", f.transport().send(message(3)))
            .await
            .is_err()
    );
    assert_eq!(f.seqs(), vec![3], "an unrecoverable failure is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn has_no_storage_abilities() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    assert!(t.as_setup().is_none() && t.as_message_count().is_none() && t.as_listable().is_none());
    let caps = t.capabilities();
    assert!(
        !caps.redelivery && !caps.priority,
        "sync cannot redeliver or prioritise: {caps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_batch_handles_each_in_order() {
    let f = Fixture::ok_handler();
    let t = f.transport();
    assert!(
        ok("send_batch (empty)", t.send_batch(Vec::new()))
            .await
            .is_empty()
    );
    let out = ok("send_batch", t.send_batch((0..10).map(message).collect())).await;
    let out_seqs: Vec<u64> = out
        .iter()
        .map(|e| e.message::<TestMessage>().map_or(u64::MAX, |m| m.seq))
        .collect();
    assert_eq!(
        out_seqs,
        (0..10).collect::<Vec<_>>(),
        "send_batch returns the envelopes in order"
    );
    assert_eq!(
        f.seqs(),
        (0..10).collect::<Vec<_>>(),
        "send_batch handles each, in order"
    );
    ok("ack_batch", t.ack_batch(&out)).await;
}

#[test]
fn sync_transport_is_the_one_under_test() {
    // The fixture's transport really is a SyncTransport (not some other transport named "sync").
    let f = Fixture::ok_handler();
    let debug = format!("{:?}", f.transport());
    assert!(debug.starts_with("SyncTransport"), "{debug}");
}
