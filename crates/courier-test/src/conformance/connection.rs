//! Item 10: connection loss under a running consumer loses nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use courier_core::{Envelope, Transport, TransportError};
use tokio::time::{Instant, sleep};

use super::support::{bounded, describe, expect_count, idle, message, ok, seq};
use crate::Harness;

/// Retries a transport operation while it fails with a transient error, until `deadline`.
async fn transient_retry<T, F, Fut>(h: &dyn Harness, what: &str, deadline: Instant, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, TransportError>>,
{
    loop {
        match bounded(h, what, op()).await {
            Ok(v) => return v,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!(
                "`{what}` did not recover from the connection loss: {}",
                describe(&e)
            ),
        }
    }
}

/// Five messages are sent, the harness breaks the transport's server connections
/// (`Harness::break_connection`), five more are sent (retrying transient errors for up to
/// `Harness::reconnect_timeout`); then a consumer calling `get` (retrying transient errors)
/// receives all ten, each at least once, and acks them: none is lost, and the transport ends
/// empty.
///
/// For in-process transports (`break_connection` returns `false`) there is no connection to
/// lose and the case asserts nothing more.
pub async fn connection_loss(h: &dyn Harness) {
    let t: Arc<dyn Transport> = h.transport().await;
    for s in 0..5 {
        ok(h, "send (before the break)", t.send(message(s))).await;
    }
    if !h.break_connection(&t).await {
        return; // in-process transport: nothing to break
    }
    let deadline = Instant::now() + h.reconnect_timeout();
    for s in 5..10 {
        transient_retry(h, "send (after the break)", deadline, || t.send(message(s))).await;
    }
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + h.reconnect_timeout();
    while seen.len() < 10 && Instant::now() < deadline {
        let got: Vec<Envelope> =
            transient_retry(h, "get (after the break)", deadline, || t.get(10)).await;
        if got.is_empty() {
            idle().await;
        }
        for e in got {
            let s = seq(&e);
            transient_retry(h, "ack (after the break)", deadline, || t.ack(&e)).await;
            seen.insert(s);
        }
    }
    let missing: Vec<u64> = (0..10).filter(|s| !seen.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "messages lost across the connection loss: {missing:?} (received {seen:?})"
    );
    expect_count(h, &t, 0, "after receiving and acking all ten").await;
}
