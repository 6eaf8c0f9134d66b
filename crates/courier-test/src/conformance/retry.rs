//! Item 7: `retry` is at-least-once and carries the new stamps.

use std::time::Duration;

use courier_core::{ErrorDetailsStamp, RedeliveryStamp};
use tokio::time::Instant;

use super::support::{expect_count, expect_nothing, ok, receive, receive_within, send_seqs, seq};
use crate::Harness;

/// The delay used for a delayed retry.
const RETRY_DELAY: Duration = Duration::from_millis(1000);

/// After `retry(envelope, 1 s)` of a received message carrying a new `RedeliveryStamp` and
/// `ErrorDetailsStamp`, the message counts once (the old delivery is gone, the new one is
/// waiting), is not delivered before the delay, then comes back exactly once with the new
/// stamps; once acked it is gone for good (the old delivery does not come back either).
/// On a transport that cannot delay, the same with a zero delay.
pub async fn retry_redelivers_once_with_new_stamps(h: &dyn Harness) {
    let t = h.transport().await;
    let delay = if t.capabilities().delay {
        RETRY_DELAY
    } else {
        Duration::ZERO
    };
    send_seqs(h, &t, [1]).await;
    let got = receive(h, &t, 1, "the first delivery").await;
    let failed = got[0]
        .clone()
        .with(RedeliveryStamp::new(1))
        .with_error_details(ErrorDetailsStamp::new("error", "handler failed", vec![]));
    let start = Instant::now();
    ok(h, "retry", t.retry(failed, delay)).await;
    expect_count(
        h,
        &t,
        1,
        "right after retry (old delivery must be gone, new one waiting)",
    )
    .await;

    let deadline = delay + h.poll_window() + Duration::from_secs(2);
    let back = receive_within(h, &t, 1, deadline).await;
    assert_eq!(
        back.len(),
        1,
        "the retried message did not come back within {deadline:?}"
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed + Duration::from_millis(10) >= delay,
        "the retried message came back after {elapsed:?}, before its delay of {delay:?}"
    );
    let back = &back[0];
    assert_eq!(seq(back), 1);
    assert_eq!(
        back.last::<RedeliveryStamp>().map(|r| r.retry_count),
        Some(1),
        "RedeliveryStamp lost on retry"
    );
    assert_eq!(
        back.last::<ErrorDetailsStamp>().map(|d| d.message.as_str()),
        Some("handler failed"),
        "ErrorDetailsStamp lost on retry"
    );
    expect_nothing(h, &t, "a retried message must come back exactly once").await;
    ok(h, "ack (retried)", t.ack(back)).await;
    expect_count(h, &t, 0, "after acking the retried message").await;
    h.expire_deliveries(&t).await;
    expect_nothing(h, &t, "after retry + ack, neither delivery may come back").await;
}

/// `retry(envelope, Duration::ZERO)` makes the message available again at once.
pub async fn retry_without_delay_is_immediately_available(h: &dyn Harness) {
    let t = h.transport().await;
    send_seqs(h, &t, [1, 2]).await;
    let first = receive(h, &t, 1, "the first delivery").await;
    assert_eq!(seq(&first[0]), 1);
    ok(
        h,
        "retry (zero delay)",
        t.retry(
            first[0].clone().with(RedeliveryStamp::new(1)),
            Duration::ZERO,
        ),
    )
    .await;
    expect_count(h, &t, 2, "after a zero-delay retry").await;
    let got = receive(h, &t, 2, "message 2 and the retried message 1").await;
    let mut s: Vec<u64> = got.iter().map(seq).collect();
    s.sort_unstable();
    assert_eq!(
        s,
        vec![1, 2],
        "both the retried and the waiting message must be available at once"
    );
    for e in &got {
        ok(h, "ack", t.ack(e)).await;
    }
    expect_count(h, &t, 0, "after acking both").await;
}
