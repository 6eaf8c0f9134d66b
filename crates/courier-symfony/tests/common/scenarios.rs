//! The interop scenarios every Symfony-layout transport passes alike (Doctrine, Redis, AMQP):
//! each takes Courier's transport and PHP's DSN, the test files add what only their server can
//! check.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{
    CancellationToken, DelayStamp, Envelope, ErrorDetailsStamp, HandlerError, MessageBus,
    MultiplierRetryStrategy, PriorityStamp, RedeliveryStamp, Transport, Worker, WorkerStats,
};

use super::{Consumed, SendEmail, consumed, email, ids, php};

/// How long one PHP script may run.
pub(crate) const PHP_LIMIT: Duration = Duration::from_secs(120);

/// `f`, within 30 seconds.
pub(crate) async fn timeout<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("operation timed out")
}

/// Receives and acks until `n` envelopes came (or `within` passed): what came.
pub(crate) async fn drain(t: &dyn Transport, n: usize, within: Duration) -> Vec<Envelope> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n && start.elapsed() < within {
        let batch = timeout(t.get(100)).await.unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        timeout(t.ack_batch(&batch)).await.unwrap();
        got.extend(batch);
    }
    got
}

/// Courier sends `email(first..first+n)` sent in `offset`, every 10th delayed by a second, each
/// with a stamp only Courier knows (a plain header to PHP).
pub(crate) async fn courier_sends(t: &dyn Transport, first: i64, n: i64, offset: &str) {
    let envelopes = (first..first + n)
        .map(|id| {
            let envelope = Envelope::new(email(id, offset)).with(PriorityStamp(3));
            if id % 10 == 0 {
                envelope.with(DelayStamp(Duration::from_secs(1)))
            } else {
                envelope
            }
        })
        .collect();
    timeout(t.send_batch(envelopes)).await.unwrap();
}

/// `got` are the messages 1 to 1,000 `dispatch.php` sent in UTC, each once.
pub(crate) fn assert_courier_got_the_1000<'a>(got: impl IntoIterator<Item = &'a Envelope>) {
    let mut seen = BTreeSet::new();
    for envelope in got {
        let message = envelope
            .message::<SendEmail>()
            .unwrap_or_else(|| panic!("{:?}", envelope.decode_error()));
        assert_eq!(message, &email(message.id, "+00:00"));
        assert!(seen.insert(message.id), "{} twice", message.id);
    }
    assert_eq!(seen, ids(1..=1000));
}

/// Courier drains the 1,000 messages PHP dispatched (within 30 seconds) and got each once.
pub(crate) async fn courier_drains_php_1000(t: &dyn Transport) {
    let got = drain(t, 1000, Duration::from_secs(30)).await;
    assert_courier_got_the_1000(&got);
}

/// PHP in `zone` consumes the 1,000 messages `courier_sends` sent in `offset` on `php_dsn`: each
/// once, read as Courier wrote it.
pub(crate) async fn php_consumes_courier_1000(php_dsn: &str, zone: &str, offset: &str) {
    let out = php("consume.php", &[php_dsn, "1000", "60"], zone, PHP_LIMIT).await;
    let lines = consumed(&out);
    let mut seen = BTreeSet::new();
    for line in &lines {
        let id = line.id.unwrap();
        let expected = email(id, offset);
        assert_eq!(line.class, r"App\Message\SendEmail");
        assert_eq!(line.retry, 0);
        assert_eq!(line.subject.as_deref(), Some(expected.subject.as_str()));
        let priority = if id % 2 == 0 { "high" } else { "low" };
        assert_eq!(line.priority.as_deref(), Some(priority));
        assert_eq!(
            line.sent_at.as_deref(),
            Some(format!("2024-05-06T07:08:09{offset}").as_str())
        );
        assert!(seen.insert(id), "{id} twice");
    }
    assert_eq!(seen, ids(1..=1000), "PHP consumed them all");
}

/// PHP dispatches messages 1 to 20 on `php_dsn` and fails each once: Symfony's retry listener
/// sends it again with RedeliveryStamp 1.
pub(crate) async fn php_fails_20_once(php_dsn: &str) {
    php("dispatch.php", &[php_dsn, "1", "20"], "UTC", PHP_LIMIT).await;
    let out = php(
        "consume.php",
        &[php_dsn, "20", "30", "fail-new"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert_eq!(consumed(&out).len(), 20);
}

/// Runs `worker` to its limit, within a minute: its stats.
async fn run_within_a_minute(worker: Worker) -> WorkerStats {
    tokio::time::timeout(
        Duration::from_secs(60),
        worker.run(CancellationToken::new()),
    )
    .await
    .expect("worker in time")
    .unwrap()
}

/// The retries of these tests: 3 at most, a second apart, no jitter.
pub(crate) fn retry_strategy() -> MultiplierRetryStrategy {
    MultiplierRetryStrategy::default()
        .max_retries(3)
        .delay(Duration::from_secs(1))
        .jitter(0.0)
}

/// A Courier worker on `t` (receiver `receiver`) whose handler fails each of `n` messages,
/// retried with `strategy`: the retry count each came with, and the worker's stats.
pub(crate) async fn retry_worker(
    t: Arc<dyn Transport>,
    receiver: &str,
    strategy: MultiplierRetryStrategy,
    n: u64,
) -> (Vec<u32>, WorkerStats) {
    let bus = MessageBus::builder()
        .handler_fn("fail", move |_: Arc<SendEmail>| async move {
            Err::<(), _>(HandlerError::recoverable("failed in Rust", None))
        })
        .build();
    let retries = Arc::new(Mutex::new(Vec::new()));
    let on_received = Arc::clone(&retries);
    let worker = Worker::builder(bus)
        .receiver(receiver, t)
        .retry_strategy(Arc::new(strategy))
        .on_received(move |received| {
            let count = received
                .envelope()
                .last::<RedeliveryStamp>()
                .map_or(0, |s| s.retry_count);
            on_received.lock().unwrap().push(count);
        })
        .limit(n)
        .build();
    let stats = run_within_a_minute(worker).await;
    let counts = retries.lock().unwrap().clone();
    (counts, stats)
}

/// Courier fails again each of the 20 PHP failed once: it read PHP's retry count, and retried
/// each (with RedeliveryStamp 2).
pub(crate) async fn courier_fails_php_retries_again(
    t: Arc<dyn Transport>,
    receiver: &str,
    strategy: MultiplierRetryStrategy,
) {
    let (counts, stats) = retry_worker(t, receiver, strategy, 20).await;
    assert_eq!(stats.retried, 20, "{stats:?}");
    assert_eq!(counts, vec![1; 20], "Courier read PHP's retry count");
}

/// PHP consumes the 20 messages Courier retried on `php_dsn`, each with the count `retry`: the
/// lines it printed.
pub(crate) async fn php_reads_courier_retries(php_dsn: &str, retry: u32) -> Vec<Consumed> {
    let out = php("consume.php", &[php_dsn, "20", "30"], "UTC", PHP_LIMIT).await;
    let lines = consumed(&out);
    assert_eq!(lines.len(), 20, "{lines:?}");
    assert!(
        lines.iter().all(|l| l.retry == retry),
        "PHP read Courier's retry count: {lines:?}"
    );
    lines
}

/// Courier sends 1,000 messages, then a PHP worker (for `php_seconds`) and Courier consume them
/// together until `done(php finished, time since Courier started)` says so when Courier finds
/// none: both took a share, none was handled twice, none lost.
pub(crate) async fn php_and_courier_share_1000(
    t: &dyn Transport,
    php_dsn: String,
    php_seconds: &'static str,
    mut done: impl AsyncFnMut(bool, Duration) -> bool,
) {
    courier_sends(t, 1, 1000, "+00:00").await;
    let php_side = tokio::spawn(async move {
        php(
            "consume.php",
            &[&php_dsn, "1000", php_seconds],
            "UTC",
            PHP_LIMIT,
        )
        .await
    });
    let mut courier_ids = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let batch = timeout(t.get(5)).await.unwrap();
        if batch.is_empty() {
            if done(php_side.is_finished(), start.elapsed()).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        courier_ids.extend(batch.iter().map(|e| e.message::<SendEmail>().unwrap().id));
        // Slower than PHP alone, so that both sides take a share.
        tokio::time::sleep(Duration::from_millis(10)).await;
        timeout(t.ack_batch(&batch)).await.unwrap();
    }
    let php_ids: Vec<i64> = consumed(&php_side.await.unwrap())
        .iter()
        .map(|l| l.id.unwrap())
        .collect();
    assert!(
        !courier_ids.is_empty() && !php_ids.is_empty(),
        "both took a share: courier {}, php {}",
        courier_ids.len(),
        php_ids.len()
    );
    let mut all: Vec<i64> = courier_ids.iter().chain(&php_ids).copied().collect();
    all.sort_unstable();
    let unique: Vec<i64> = all
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(all, unique, "none handled twice");
    assert_eq!(all, (1..=1000).collect::<Vec<_>>(), "none lost");
}

/// PHP dispatches on `php_dsn` message 1 of a class Courier does not map and message 2 of a
/// class whose body Courier cannot read.
pub(crate) async fn php_dispatches_unreadable(php_dsn: &str) {
    for (id, class) in [("1", "Unmapped"), ("2", "Misfit")] {
        php(
            "dispatch.php",
            &[php_dsn, id, "1", "0", class],
            "UTC",
            PHP_LIMIT,
        )
        .await;
    }
}

/// A Courier worker on `t` (receiver `receiver`) moves the `n` messages it cannot read to
/// `failed` (its failure transport): all `n` moved.
pub(crate) async fn courier_moves_unreadable_to(
    t: Arc<dyn Transport>,
    receiver: &str,
    failed: Arc<dyn Transport>,
    n: u64,
) {
    let bus = MessageBus::builder()
        .handler_fn("never", |_: Arc<SendEmail>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    let worker = Worker::builder(bus)
        .receiver(receiver, t)
        .failure_transport("failed", failed)
        .limit(n)
        .build();
    let stats = run_within_a_minute(worker).await;
    assert_eq!(stats.moved_to_failure, n, "{stats:?}");
}

/// The `n` envelopes in the failure transport `failed`, sorted by name, and each one's name
/// and the reason its `ErrorDetailsStamp` gives.
pub(crate) async fn failure_reasons(
    failed: &dyn Transport,
    n: usize,
) -> (Vec<Envelope>, Vec<(String, String)>) {
    let mut moved = drain(failed, n, Duration::from_secs(10)).await;
    moved.sort_by_key(|e| e.message_name().to_owned());
    let reasons: Vec<(String, String)> = moved
        .iter()
        .map(|e| {
            let details = e.last::<ErrorDetailsStamp>().expect("error details");
            (e.message_name().to_owned(), details.message.clone())
        })
        .collect();
    assert_eq!(reasons.len(), n, "{reasons:?}");
    (moved, reasons)
}

/// `reasons` are those of `php_dispatches_unreadable`'s two, in order: the unmapped class is
/// named, the misfit's body is invalid.
pub(crate) fn assert_unmapped_and_misfit(reasons: &[(String, String)]) {
    assert_eq!(reasons[0].0, r"App\Message\Unmapped");
    assert!(
        reasons[0].1.contains(r"App\Message\Unmapped"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, "mail.misfit");
    assert!(reasons[1].1.contains("invalid JSON body"), "{reasons:?}");
}
