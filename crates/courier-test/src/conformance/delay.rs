//! Item 3: `DelayStamp` is honoured, or refused by the capability check; never ignored.

use std::time::Duration;

use courier_core::{DelayStamp, TransportErrorKind};
use tokio::time::Instant;

use super::support::{
    bounded, describe, expect_count, expect_nothing, idle, message, ok, receive_within, seq,
};
use crate::Harness;

/// The delay the suite uses: long enough to tell "delayed" from "immediate", short enough to
/// keep the suite fast.
pub const DELAY: Duration = Duration::from_millis(1500);

/// Clock granularity tolerated on the early side (millisecond timestamps on the server).
const EARLY_TOLERANCE: Duration = Duration::from_millis(10);

/// On a transport that can delay, a message with `DelayStamp(1.5 s)` is not delivered before
/// 1.5 s have passed since it was sent, and is delivered within 1.5 s + the poll window (+1 s
/// slack). A message sent without delay at the same time is delivered at once, before it.
pub async fn delayed_message_waits_its_delay(h: &dyn Harness) {
    let t = h.transport().await;
    if !t.capabilities().delay {
        return; // covered by `delay_is_refused_without_capability`
    }
    let start = Instant::now();
    ok(
        h,
        "send (delayed)",
        t.send(message(1).with(DelayStamp(DELAY))),
    )
    .await;
    ok(h, "send (immediate)", t.send(message(2))).await;

    let immediate =
        receive_within(h, &t, 1, DELAY.saturating_sub(Duration::from_millis(300))).await;
    assert_eq!(
        immediate.len(),
        1,
        "the undelayed message must come at once, before the delayed one"
    );
    assert_eq!(
        seq(&immediate[0]),
        2,
        "the delayed message came {:?} after send, before its delay",
        start.elapsed()
    );
    ok(h, "ack", t.ack(&immediate[0])).await;

    let deadline = DELAY + h.poll_window() + Duration::from_secs(1);
    let mut got = Vec::new();
    while got.is_empty() && start.elapsed() < deadline {
        got = ok(h, "get", t.get(10)).await;
        if got.is_empty() {
            idle().await;
        } else {
            let elapsed = start.elapsed();
            assert!(
                elapsed + EARLY_TOLERANCE >= DELAY,
                "a message with DelayStamp({DELAY:?}) was delivered after only {elapsed:?}"
            );
        }
    }
    assert_eq!(
        got.len(),
        1,
        "the delayed message did not arrive within {deadline:?} (delay + poll window + 1 s)"
    );
    assert_eq!(seq(&got[0]), 1);
    ok(h, "ack", t.ack(&got[0])).await;
    expect_count(h, &t, 0, "after acking both").await;
}

/// A delay longer than `capabilities().max_delay` is refused with `Unsupported` and nothing is
/// stored (only checked where the transport declares a maximum).
pub async fn delay_beyond_max_is_refused(h: &dyn Harness) {
    let t = h.transport().await;
    let caps = t.capabilities();
    let Some(max) = caps.max_delay.filter(|_| caps.delay) else {
        return;
    };
    let too_long = max + Duration::from_secs(1);
    match bounded(
        h,
        "send (delay beyond max)",
        t.send(message(1).with(DelayStamp(too_long))),
    )
    .await
    {
        Ok(e) => panic!(
            "a delay of {too_long:?} beyond max_delay {max:?} was accepted (id {:?})",
            e.id()
        ),
        Err(e) => assert_eq!(
            e.kind(),
            TransportErrorKind::Unsupported,
            "wrong error kind: {}",
            describe(&e)
        ),
    }
    expect_count(h, &t, 0, "after a refused send").await;
    expect_nothing(h, &t, "after a refused send").await;
}

/// A transport without the delay capability refuses a `DelayStamp` with `Unsupported` (never
/// silently delivers it early) and stores nothing; a zero delay is accepted.
pub async fn delay_is_refused_without_capability(h: &dyn Harness) {
    let t = h.transport().await;
    if t.capabilities().delay {
        return; // covered by `delayed_message_waits_its_delay`
    }
    match bounded(
        h,
        "send (delayed)",
        t.send(message(1).with(DelayStamp(DELAY))),
    )
    .await
    {
        Ok(e) => panic!(
            "a transport without delay capability accepted a DelayStamp (id {:?})",
            e.id()
        ),
        Err(e) => assert_eq!(
            e.kind(),
            TransportErrorKind::Unsupported,
            "wrong error kind: {}",
            describe(&e)
        ),
    }
    expect_count(h, &t, 0, "after a refused send").await;
    ok(
        h,
        "send (zero delay)",
        t.send(message(2).with(DelayStamp(Duration::ZERO))),
    )
    .await;
    let got = receive_within(h, &t, 1, h.poll_window() * 2 + Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1, "a zero DelayStamp must be delivered at once");
    assert_eq!(seq(&got[0]), 2);
    ok(h, "ack", t.ack(&got[0])).await;
}
