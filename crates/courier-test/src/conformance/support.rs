//! Helpers the cases share: every await on a transport is bounded, every failure panics with a
//! message that names the operation and what was expected.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{Envelope, Transport, TransportError};
use tokio::time::Instant;

use crate::{Harness, TestMessage};

/// How long one transport operation may take before the case fails: the harness's
/// [`operation_timeout`](Harness::operation_timeout) plus its poll window (a `get` may wait that
/// long before returning empty).
#[must_use]
pub fn op_timeout(h: &dyn Harness) -> Duration {
    h.operation_timeout() + h.poll_window()
}

/// Awaits `fut`, panicking when it takes longer than [`op_timeout`]: a broken transport fails
/// the case instead of hanging it.
///
/// # Panics
/// When the operation does not finish in time.
pub async fn bounded<T>(h: &dyn Harness, what: &str, fut: impl Future<Output = T>) -> T {
    let limit = op_timeout(h);
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!(
            "transport operation `{what}` did not finish within {limit:?}: a transport must never hang"
        ),
    }
}

/// Awaits a transport operation with [`bounded`] and expects it to succeed.
///
/// # Panics
/// When it times out or returns an error (printed with its kind and cause chain).
pub async fn ok<T>(
    h: &dyn Harness,
    what: &str,
    fut: impl Future<Output = Result<T, TransportError>>,
) -> T {
    match bounded(h, what, fut).await {
        Ok(v) => v,
        Err(e) => panic!("transport operation `{what}` failed: {}", describe(&e)),
    }
}

/// An error with its kind and its whole `source()` chain, for panic messages.
#[must_use]
pub fn describe(err: &TransportError) -> String {
    let mut out = format!("{err} (kind {:?})", err.kind());
    let mut cur = std::error::Error::source(err);
    while let Some(e) = cur {
        out.push_str(&format!(": {e}"));
        cur = e.source();
    }
    out
}

/// A [`TestMessage`] envelope with sequence number `seq`.
#[must_use]
pub fn message(seq: u64) -> Envelope {
    Envelope::new(TestMessage::new(seq))
}

/// The sequence number of a received [`TestMessage`].
///
/// # Panics
/// When the envelope holds something else or could not be decoded.
#[must_use]
pub fn seq(envelope: &Envelope) -> u64 {
    match envelope.message::<TestMessage>() {
        Some(m) => m.seq,
        None => panic!(
            "expected a decoded `courier.test` message, got `{}` (decode error: {:?}, stamps: {:?})",
            envelope.message_name(),
            envelope.decode_error().map(ToString::to_string),
            envelope.stamp_names().collect::<Vec<_>>()
        ),
    }
}

/// The sequence numbers of several envelopes, in order.
#[must_use]
pub fn seqs(envelopes: &[Envelope]) -> Vec<u64> {
    envelopes.iter().map(seq).collect()
}

/// The transport id of an envelope returned by `send` or `get`.
///
/// # Panics
/// When it carries no `TransportMessageIdStamp`.
#[must_use]
pub fn id(envelope: &Envelope, from: &str) -> String {
    match envelope.id() {
        Some(id) => id.to_owned(),
        None => panic!(
            "the envelope returned by `{from}` has no TransportMessageIdStamp (stamps: {:?})",
            envelope.stamp_names().collect::<Vec<_>>()
        ),
    }
}

/// Sends messages `seqs` one by one; returns what `send` returned.
pub async fn send_seqs(
    h: &dyn Harness,
    t: &Arc<dyn Transport>,
    seqs: impl IntoIterator<Item = u64>,
) -> Vec<Envelope> {
    let mut sent = Vec::new();
    for s in seqs {
        sent.push(ok(h, "send", t.send(message(s))).await);
    }
    sent
}

/// Calls `get` until `n` envelopes came or `within` has passed, asking each time for what is
/// still missing (a `get` may return fewer than asked, or wait up to the poll window). Returns
/// what came, which may be fewer than `n`.
///
/// # Panics
/// When a `get` fails, hangs, or returns more than it was asked for.
pub async fn receive_within(
    h: &dyn Harness,
    t: &Arc<dyn Transport>,
    n: usize,
    within: Duration,
) -> Vec<Envelope> {
    let deadline = Instant::now() + within;
    let mut got = Vec::with_capacity(n);
    while got.len() < n && Instant::now() < deadline {
        let want = n - got.len();
        let batch = ok(h, "get", t.get(want)).await;
        assert!(
            batch.len() <= want,
            "get({want}) returned {} envelopes, more than asked",
            batch.len()
        );
        if batch.is_empty() {
            idle().await;
        }
        got.extend(batch);
    }
    got
}

/// A short pause after an empty `get`, so polling a transport whose `get` returns at once does
/// not spin the CPU.
pub async fn idle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// How long [`receive`] waits for messages that are already available.
#[must_use]
pub fn receive_window(h: &dyn Harness) -> Duration {
    h.poll_window() * 2 + Duration::from_secs(5)
}

/// Receives exactly `n` envelopes that are already available (waiting up to [`receive_window`]).
///
/// # Panics
/// When fewer come (naming `what` and the sequence numbers that did come).
pub async fn receive(
    h: &dyn Harness,
    t: &Arc<dyn Transport>,
    n: usize,
    what: &str,
) -> Vec<Envelope> {
    let got = receive_within(h, t, n, receive_window(h)).await;
    assert_eq!(
        got.len(),
        n,
        "{what}: expected {n} message(s) within {:?}, received {} (seqs {:?})",
        receive_window(h),
        got.len(),
        got.iter()
            .map(|e| e.message::<TestMessage>().map(|m| m.seq))
            .collect::<Vec<_>>()
    );
    got
}

/// Asserts that one `get` returns nothing.
///
/// # Panics
/// When it returns messages (their sequence numbers are printed).
pub async fn expect_nothing(h: &dyn Harness, t: &Arc<dyn Transport>, what: &str) {
    let got = ok(h, "get", t.get(10)).await;
    assert!(
        got.is_empty(),
        "{what}: expected no message, get returned {} (seqs {:?}, ids {:?})",
        got.len(),
        got.iter()
            .map(|e| e.message::<TestMessage>().map(|m| m.seq))
            .collect::<Vec<_>>(),
        got.iter().map(Envelope::id).collect::<Vec<_>>()
    );
}

/// The transport's message count, when it can count.
pub async fn count(h: &dyn Harness, t: &Arc<dyn Transport>) -> Option<u64> {
    match t.as_message_count() {
        Some(c) => Some(ok(h, "message_count", c.message_count()).await),
        None => None,
    }
}

/// Asserts the message count is `expected` (when the transport can count).
///
/// # Panics
/// When the count differs.
pub async fn expect_count(h: &dyn Harness, t: &Arc<dyn Transport>, expected: u64, what: &str) {
    if let Some(n) = count(h, t).await {
        assert_eq!(
            n, expected,
            "{what}: message_count is {n}, expected {expected}"
        );
    }
}

/// Acks every envelope, one by one.
pub async fn ack_all(h: &dyn Harness, t: &Arc<dyn Transport>, envelopes: &[Envelope]) {
    for e in envelopes {
        ok(h, "ack", t.ack(e)).await;
    }
}

/// Asserts the envelopes' ids are pairwise distinct.
///
/// # Panics
/// When two share an id.
pub fn assert_distinct_ids(envelopes: &[Envelope], from: &str) {
    let ids: Vec<String> = envelopes.iter().map(|e| id(e, from)).collect();
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "`{from}` gave duplicate transport ids: {ids:?}"
    );
}
