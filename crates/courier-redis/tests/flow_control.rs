//! Flow control per key on Redis (a keyed queue): `concurrency_max` holds across workers with
//! connections of their own, a dead worker's slot frees itself when its lease ends, a killed
//! worker leaks no slot, an ack wakes a worker waiting for the slot, bad keys and options get
//! clear errors, and `fair=true` serves one key per turn so that one key's backlog does not
//! starve the others (pickup latency p99 printed beside the plain stream's FIFO).

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::RedisHarness;
use courier_core::{ConcurrencyKeyStamp, Dsn, Envelope, Transport};
use courier_redis::{RedisOptions, RedisTransport};
use courier_test::TestMessage;

async fn timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("operation timed out")
}

fn keyed(seq: u64, key: &str) -> Envelope {
    Envelope::new(TestMessage::new(seq)).with(ConcurrencyKeyStamp::new(key).unwrap())
}

fn key_of(e: &Envelope) -> String {
    e.last::<ConcurrencyKeyStamp>()
        .map(|k| k.as_str().to_owned())
        .unwrap_or_default()
}

fn seq(e: &Envelope) -> u64 {
    e.message::<TestMessage>().unwrap().seq
}

fn seqs(got: &[Envelope]) -> Vec<u64> {
    got.iter().map(seq).collect()
}

const WORKERS: usize = 6;
const KEYS: u64 = 20;
const MESSAGES: u64 = 600;
const MAX: u32 = 3;

/// A queue on a fresh stream (its keys deleted with the harness).
struct Queue {
    h: RedisHarness,
    options: RedisOptions,
}

impl Queue {
    fn new(options: impl FnOnce(RedisOptions) -> RedisOptions) -> Self {
        let h = RedisHarness::new();
        let stream = courier_test::env::unique_name("courier_flow");
        let options = options(h.options(&stream).poll_window(Duration::from_millis(200)));
        Self { h, options }
    }

    /// A worker with connections and a consumer name of its own (another process, as far as
    /// Redis can tell).
    async fn worker(&self) -> Arc<RedisTransport> {
        let consumer = format!("w-{:016x}", fastrand::u64(..));
        self.h
            .with_options(self.options.clone().consumer(consumer))
            .await
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.h.conn().await
    }

    fn key(&self, name: &str) -> String {
        format!("{}:keyed:{name}", self.options.stream)
    }

    /// The slots in use per key and the live leases: both empty once every message is settled.
    async fn slots(&self) -> (HashMap<String, i64>, u64) {
        let mut conn = self.conn().await;
        let busy: HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(self.key("busy"))
            .query_async(&mut conn)
            .await
            .unwrap();
        // The deliveries' leases, not the member at +inf that keeps the set a skiplist.
        let leases: u64 = redis::cmd("ZCOUNT")
            .arg(self.key("leases"))
            .arg("-inf")
            .arg("(+inf")
            .query_async(&mut conn)
            .await
            .unwrap();
        (busy, leases)
    }

    /// Ends every lease now, as if its worker had stopped keeping it alive a window ago.
    async fn expire_leases(&self) {
        let mut conn = self.conn().await;
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.key("leases"))
            .arg("-inf")
            .arg("(+inf")
            .query_async(&mut conn)
            .await
            .unwrap();
        for id in ids {
            let _: () = redis::cmd("ZADD")
                .arg(self.key("leases"))
                .arg("XX")
                .arg(0)
                .arg(id)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

async fn count(t: &RedisTransport) -> u64 {
    timeout(courier_core::MessageCount::message_count(t))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn at_most_max_per_key_are_in_flight_across_workers() {
    let (most, limited) = run_workers(Some(MAX)).await;
    let over: Vec<_> = most.iter().filter(|(_, n)| **n > MAX as usize).collect();
    assert!(over.is_empty(), "more than {MAX} in flight: {over:?}");
    assert!(
        most.values().any(|n| *n == MAX as usize),
        "no key ever had {MAX} in flight: {most:?}"
    );
    let (most, unlimited) = run_workers(None).await;
    assert!(
        most.values().any(|n| *n > MAX as usize),
        "the same run without a limit goes over {MAX} (the check can fail): {most:?}"
    );
    println!(
        "redis: {MESSAGES} messages over {KEYS} keys by {WORKERS} workers: concurrency_max={MAX} \
         {limited:?}, unlimited {unlimited:?}"
    );
}

/// 6 workers, each with connections of its own, 600 messages over 20 keys; returns the most in
/// flight seen per key (between get and ack) and the time it took. `None`: a plain queue.
async fn run_workers(max: Option<u32>) -> (HashMap<String, usize>, Duration) {
    let q = Queue::new(|o| match max {
        Some(max) => o.concurrency_max(max),
        None => o,
    });
    let first = q.worker().await;
    let batch: Vec<Envelope> = (0..MESSAGES)
        .map(|i| keyed(i, &format!("tenant-{}", i % KEYS)))
        .collect();
    timeout(first.send_batch(batch)).await.unwrap();
    let mut workers = vec![first];
    for _ in 1..WORKERS {
        workers.push(q.worker().await);
    }
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let most: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in workers.clone() {
        let (in_flight, most, handled) = (in_flight.clone(), most.clone(), handled.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if handled.lock().unwrap().len() as u64 >= MESSAGES {
                    return;
                }
                assert!(Instant::now() < deadline, "not every message was handled");
                let got = timeout(t.get(10)).await.unwrap();
                for e in &got {
                    let key = key_of(e);
                    let mut live = in_flight.lock().unwrap();
                    let n = live.entry(key.clone()).or_default();
                    *n += 1;
                    let mut most = most.lock().unwrap();
                    let m = most.entry(key).or_default();
                    *m = (*m).max(*n);
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
                for e in &got {
                    *in_flight.lock().unwrap().get_mut(&key_of(e)).unwrap() -= 1;
                    *handled.lock().unwrap().entry(seq(e)).or_default() += 1;
                }
                timeout(t.ack_batch(&got)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let handled = handled.lock().unwrap().clone();
    assert_eq!(handled.len() as u64, MESSAGES);
    let twice: Vec<_> = handled.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(count(&workers[0]).await, 0);
    if max.is_some() {
        assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
    }
    let most = most.lock().unwrap().clone();
    (most, elapsed)
}

/// A worker dies holding a key's only slot (max 1), nothing acked. The key's other message
/// waits: another worker gets nothing of that key while the lease lives; once it ends, the
/// dead worker's message is delivered again first (delivery count 2), still alone, and the
/// next one waits for its ack. The dead worker's late ack is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_dead_workers_slot_frees_itself_when_its_lease_ends() {
    let q = Queue::new(|o| o.concurrency_max(1));
    let doomed = q.worker().await;
    timeout(doomed.send_batch(vec![keyed(1, "k"), keyed(2, "k"), keyed(3, "other")]))
        .await
        .unwrap();
    let got = timeout(doomed.get(10)).await.unwrap();
    let mut got_seqs = seqs(&got);
    got_seqs.sort_unstable();
    assert_eq!(got_seqs, vec![1, 3], "one of key k, one of key other");
    let (held, other): (Vec<Envelope>, Vec<Envelope>) =
        got.into_iter().partition(|e| key_of(e) == "k");
    timeout(doomed.ack_batch(&other)).await.unwrap();
    let survivor = q.worker().await;
    let none = timeout(survivor.get(10)).await.unwrap();
    assert!(
        none.is_empty(),
        "key k's slot is held by the dead worker's live lease: {:?}",
        seqs(&none)
    );
    q.expire_leases().await;
    let again = timeout(survivor.get(10)).await.unwrap();
    assert_eq!(seqs(&again), vec![1], "the dead worker's message, alone");
    assert_eq!(
        again[0]
            .last::<courier_core::DeliveryTagStamp>()
            .map(|t| t.0.clone()),
        Some("2\nk".to_owned()),
        "a second delivery (its count, then its key)"
    );
    // The dead worker's late ack must not free the survivor's slot.
    timeout(doomed.ack_batch(&held)).await.unwrap();
    assert!(
        timeout(survivor.get(10)).await.unwrap().is_empty(),
        "a superseded ack freed the slot"
    );
    timeout(survivor.ack(&again[0])).await.unwrap();
    let next = timeout(survivor.get(10)).await.unwrap();
    assert_eq!(seqs(&next), vec![2], "the ack freed the slot");
    timeout(survivor.ack(&next[0])).await.unwrap();
    assert_eq!(count(&survivor).await, 0);
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
}

/// A worker waiting for a full key's slot is woken by the ack that frees it (a signal), not by
/// polling: its poll window is 60 s, as is the lease. Without the signal its `get` would
/// return at the window's end; with it, it returns within 15 s (in practice milliseconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn an_ack_wakes_a_worker_waiting_for_the_slot() {
    let q = Queue::new(|o| {
        o.concurrency_max(1)
            .redeliver_timeout(Duration::from_secs(60))
            .poll_window(Duration::from_secs(60))
    });
    let holder = q.worker().await;
    timeout(holder.send_batch(vec![keyed(1, "k"), keyed(2, "k")]))
        .await
        .unwrap();
    let held = timeout(holder.get(10)).await.unwrap();
    assert_eq!(seqs(&held), vec![1], "one slot");
    let waiter = q.worker().await;
    let waiting = tokio::spawn(async move { waiter.get(10).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the key is full: the waiter waits");
    let acked_at = Instant::now();
    timeout(holder.ack(&held[0])).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the ack did not wake the waiting worker")
        .unwrap();
    assert_eq!(seqs(&got), vec![2], "woken by the ack");
    println!("redis: woken {:?} after the ack", acked_at.elapsed());
    timeout(holder.ack_batch(&got)).await.ok();
}

/// The leases of a keyed queue stay in Redis's skiplist encoding however few deliveries are in
/// flight (in the listpack encoding of small sets, each `ZADD` and `ZREM` scans the set), and
/// the member that keeps them there is never delivered, counted or waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn the_leases_stay_a_skiplist_and_its_pin_is_never_a_delivery() {
    let q = Queue::new(|o| o.concurrency_max(2));
    let w = q.worker().await;
    timeout(w.send_batch(vec![keyed(1, "a"), keyed(2, "b")]))
        .await
        .unwrap();
    let got = timeout(w.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![1, 2]);
    let mut conn = q.conn().await;
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(q.key("leases"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(encoding, "skiplist", "two deliveries in flight");
    // Their leases end unrenewed: both come back, and nothing else does.
    q.expire_leases().await;
    let other = q.worker().await;
    let again = timeout(other.get(10)).await.unwrap();
    assert_eq!(
        seqs(&again),
        vec![1, 2],
        "the expired deliveries, once each"
    );
    timeout(other.ack_batch(&again)).await.unwrap();
    let (busy, leases) = q.slots().await;
    assert!(busy.is_empty(), "{busy:?}");
    assert_eq!(leases, 0);
    // Nothing in flight, nothing delayed: an idle claim finds nothing.
    assert!(timeout(other.get(10)).await.unwrap().is_empty());
}

/// The scripts settle and store a batch in one command per hash: an ack batch naming a delivery
/// twice frees its slot once (the other message of the key keeps its own), and delayed messages
/// of several keys become ready in order, each key within its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_batch_settles_each_delivery_once_and_delayed_keys_keep_their_order() {
    let q = Queue::new(|o| o.concurrency_max(2));
    let w = q.worker().await;
    timeout(w.send_batch(vec![keyed(1, "a"), keyed(2, "a"), keyed(3, "a")]))
        .await
        .unwrap();
    let got = timeout(w.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![1, 2], "two slots");
    timeout(w.ack_batch(&[got[0].clone(), got[0].clone()]))
        .await
        .unwrap();
    let (busy, leases) = q.slots().await;
    assert_eq!(busy.get("a"), Some(&1), "freed once: {busy:?}");
    assert_eq!(leases, 1);
    let next = timeout(w.get(10)).await.unwrap();
    assert_eq!(seqs(&next), vec![3], "one slot free, not two");
    timeout(w.ack_batch(&[got[1].clone(), next[0].clone()]))
        .await
        .unwrap();
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");

    // Delayed alike: due at the same millisecond, they become ready in the order sent.
    let delayed =
        |seq: u64, key| keyed(seq, key).with(courier_core::DelayStamp(Duration::from_millis(300)));
    timeout(w.send_batch(vec![
        delayed(10, "b"),
        delayed(11, "c"),
        delayed(12, "b"),
        delayed(13, "b"),
        delayed(14, "c"),
    ]))
    .await
    .unwrap();
    assert!(timeout(w.get(10)).await.unwrap().is_empty(), "not due yet");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut due = Vec::new();
    while due.len() < 4 {
        due.extend(timeout(w.get(10)).await.unwrap());
    }
    let of = |key: &str| {
        due.iter()
            .filter(|e| key_of(e) == key)
            .map(seq)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("b"), vec![10, 12], "in order, two slots");
    assert_eq!(of("c"), vec![11, 14]);
    timeout(w.ack_batch(&due)).await.unwrap();
    let last = timeout(w.get(10)).await.unwrap();
    assert_eq!(seqs(&last), vec![13]);
    timeout(w.ack_batch(&last)).await.unwrap();
    assert_eq!(q.slots().await, (HashMap::new(), 0));
}

/// Bad options fail at connect naming the option; a message whose key path is missing, not a
/// string, or too long is refused at send naming the path (nothing stored); the key comes
/// from the body when no stamp overrides it; retry and reject free the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn bad_keys_and_options_get_clear_errors() {
    let url = courier_test::env::redis_url();
    for (query, expected) in [
        ("concurrency_max=0", "concurrency_max must be at least 1"),
        (
            "concurrency_max=2&concurrency_key=tenant_id",
            "concurrency_key `tenant_id`: expected a JSON path",
        ),
        (
            "concurrency_key=$.text",
            "concurrency_key needs concurrency_max=N or fair=true",
        ),
    ] {
        let dsn = Dsn::parse(&format!("{url}?{query}")).unwrap();
        let err = RedisOptions::default().from_dsn(&dsn).unwrap_err();
        assert!(err.contains(expected), "{query}: {err}");
    }
    let bad = RedisOptions::default()
        .stream(courier_test::env::unique_name("courier_flow"))
        .concurrency_key("$.text")
        .unwrap();
    let err = RedisTransport::connect(&url, bad, courier_test::registry())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("concurrency_key needs"), "{err}");

    let q = Queue::new(|o| o.concurrency_max(1).concurrency_key("$.text").unwrap());
    let t = q.worker().await;
    let missing = Queue::new(|o| o.concurrency_max(1).concurrency_key("$.tenant").unwrap());
    let err = missing
        .worker()
        .await
        .send(Envelope::new(TestMessage::new(1)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("concurrency_key `$.tenant`: missing from the message")
            && err.contains("courier.test"),
        "{err}"
    );
    let number = Queue::new(|o| o.concurrency_max(1).concurrency_key("$.seq").unwrap());
    let err = number
        .worker()
        .await
        .send(Envelope::new(TestMessage::new(1)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("concurrency_key `$.seq`: expected a string, found a number"),
        "{err}"
    );
    let long = TestMessage {
        seq: 1,
        text: "x".repeat(201),
    };
    let err = t.send(Envelope::new(long)).await.unwrap_err().to_string();
    assert!(err.contains("201 bytes, expected at most 200"), "{err}");
    assert_eq!(count(&t).await, 0, "nothing stored");
    let same = |seq| TestMessage {
        seq,
        text: "tenant-1".to_owned(),
    };
    timeout(t.send_batch(vec![
        Envelope::new(same(1)),
        Envelope::new(same(2)),
        Envelope::new(same(3)).with(ConcurrencyKeyStamp::new("tenant-2").unwrap()),
    ]))
    .await
    .unwrap();
    let mut got = timeout(t.get(10)).await.unwrap();
    got.sort_by_key(seq);
    assert_eq!(seqs(&got), vec![1, 3], "1 and 2 share the body's key");
    // A retry frees the slot (and queues the message again behind 2); a reject frees it too.
    timeout(t.retry(got[0].clone(), Duration::ZERO))
        .await
        .unwrap();
    timeout(t.reject(&got[1])).await.unwrap();
    let got = timeout(t.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![2], "FIFO inside the key");
    timeout(t.ack_batch(&got)).await.unwrap();
    let got = timeout(t.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![1], "the retried message");
    timeout(t.ack_batch(&got)).await.unwrap();
    assert_eq!(count(&t).await, 0);
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
}

const BACKLOG: u64 = 20_000;
const OTHERS: [&str; 10] = ["B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];
const EACH: u64 = 100;

/// Consumes until every B-K message is handled; returns how many of A's were handled by then
/// and the B-K pickup latencies (from their send to their handling).
async fn consume_until_the_others_are_done(
    t: &RedisTransport,
    sent_at: Instant,
) -> (u64, Vec<Duration>) {
    let mut a_handled = 0;
    let mut latencies = Vec::new();
    let mut acks: Vec<Envelope> = Vec::new();
    let others = OTHERS.len() as u64 * EACH;
    let deadline = Instant::now() + Duration::from_secs(600);
    while (latencies.len() as u64) < others {
        assert!(
            Instant::now() < deadline,
            "the other tenants were not served"
        );
        let got = timeout(t.ack_and_get(&acks, 50)).await.unwrap();
        for e in &got {
            if key_of(e) == "A" {
                a_handled += 1;
            } else {
                latencies.push(sent_at.elapsed());
            }
        }
        acks = got;
    }
    timeout(t.ack_batch(&acks)).await.unwrap();
    (a_handled, latencies)
}

fn p99(mut latencies: Vec<Duration>) -> Duration {
    latencies.sort_unstable();
    let at = (latencies.len() * 99).div_ceil(100).saturating_sub(1);
    latencies.get(at).copied().unwrap_or_default()
}

/// Tenant A has 20,000 queued, then B to K enqueue 100 each: with `fair=true` every B-K message
/// is handled before 10 % of A's backlog is. The same run on a plain stream (FIFO) serves A's
/// whole backlog first; both B-K pickup latency p99s are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn fair_claims_serve_every_tenant_before_a_tenth_of_a_backlog() {
    let mut p99s = Vec::new();
    for fair in [true, false] {
        let q = Queue::new(|o| o.fair(fair));
        let t = q.worker().await;
        for chunk in 0..BACKLOG / 1_000 {
            let batch: Vec<Envelope> = (chunk * 1_000..(chunk + 1) * 1_000)
                .map(|i| keyed(i, "A"))
                .collect();
            timeout(t.send_batch(batch)).await.unwrap();
        }
        let batch: Vec<Envelope> = OTHERS
            .iter()
            .enumerate()
            .flat_map(|(n, k)| (0..EACH).map(move |i| keyed(BACKLOG + n as u64 * EACH + i, k)))
            .collect();
        let sent_at = Instant::now();
        timeout(t.send_batch(batch)).await.unwrap();
        let (a_handled, latencies) = consume_until_the_others_are_done(&t, sent_at).await;
        if fair {
            assert!(
                a_handled < BACKLOG / 10,
                "fair: {a_handled} of A's {BACKLOG} were handled before B-K were"
            );
        } else {
            assert!(a_handled >= BACKLOG, "FIFO serves A's backlog first");
        }
        p99s.push((fair, a_handled, p99(latencies)));
    }
    for (fair, a_handled, p99) in p99s {
        println!(
            "redis {}: B-K pickup latency p99 {p99:?}, A handled before B-K were done: {a_handled}",
            if fair { "fair=true" } else { "FIFO" }
        );
    }
}

/// What one worker holds: taken off the per-key count when its handler is done or when the
/// worker is killed holding it (then its messages are abandoned: handled again once their
/// lease ends).
struct Held {
    keys: Vec<String>,
    seqs: Vec<u64>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    abandoned: Arc<Mutex<HashSet<u64>>>,
    counted: bool,
    acked: bool,
}

impl Held {
    fn release(&mut self) {
        if self.counted {
            let mut live = self.in_flight.lock().unwrap();
            for k in &self.keys {
                *live.get_mut(k).unwrap() -= 1;
            }
            self.counted = false;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release();
        if !self.acked {
            self.abandoned.lock().unwrap().extend(&self.seqs);
        }
    }
}

/// Every 100 ms one of 4 workers is aborted mid-batch (to Redis, a killed process: its
/// deliveries are never acked nor kept alive) and a new worker with connections and a consumer
/// of its own takes its place; the lease is 1 s. Sampled in the handler, never more than 3 of
/// a key in flight; every message is acked in the end, handled more than once only if a
/// killed worker held it; no slot and no lease is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn killed_workers_leak_no_slot() {
    const LIVE: usize = 4;
    let q = Queue::new(|o| {
        o.concurrency_max(MAX)
            .redeliver_timeout(Duration::from_secs(1))
    });
    let first = q.worker().await;
    let batch: Vec<Envelope> = (0..MESSAGES)
        .map(|i| keyed(i, &format!("tenant-{}", i % KEYS)))
        .collect();
    timeout(first.send_batch(batch)).await.unwrap();
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let most: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let abandoned: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let spawn = |t: Arc<RedisTransport>| {
        let (in_flight, most, handled, abandoned) = (
            in_flight.clone(),
            most.clone(),
            handled.clone(),
            abandoned.clone(),
        );
        tokio::spawn(async move {
            loop {
                let got = timeout(t.get(10)).await.unwrap();
                let mut held = Held {
                    keys: got.iter().map(key_of).collect(),
                    seqs: seqs(&got),
                    in_flight: in_flight.clone(),
                    abandoned: abandoned.clone(),
                    counted: true,
                    acked: false,
                };
                {
                    let mut live = in_flight.lock().unwrap();
                    let mut most = most.lock().unwrap();
                    for k in &held.keys {
                        let n = live.entry(k.clone()).or_default();
                        *n += 1;
                        let m = most.entry(k.clone()).or_default();
                        *m = (*m).max(*n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
                held.release();
                for seq in &held.seqs {
                    *handled.lock().unwrap().entry(*seq).or_default() += 1;
                }
                timeout(t.ack_batch(&got)).await.unwrap();
                held.acked = true;
            }
        })
    };
    let mut workers = vec![spawn(first.clone())];
    for _ in 1..LIVE {
        workers.push(spawn(q.worker().await));
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut kills = 0;
    while count(&first).await > 0 {
        assert!(Instant::now() < deadline, "not every message was acked");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let victim = fastrand::usize(..LIVE);
        workers[victim].abort();
        kills += 1;
        workers[victim] = spawn(q.worker().await);
    }
    for w in &workers {
        w.abort();
    }
    for w in workers {
        let _ = w.await;
    }
    let most = most.lock().unwrap().clone();
    let over: Vec<_> = most.iter().filter(|(_, n)| **n > MAX as usize).collect();
    assert!(over.is_empty(), "more than {MAX} in flight: {over:?}");
    let handled = handled.lock().unwrap().clone();
    let abandoned = abandoned.lock().unwrap().clone();
    assert_eq!(handled.len() as u64, MESSAGES, "every message handled");
    let again: Vec<_> = handled
        .iter()
        .filter(|(seq, n)| **n > 1 && !abandoned.contains(seq))
        .collect();
    assert!(again.is_empty(), "handled twice without a kill: {again:?}");
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
    println!(
        "redis: {kills} workers killed; {} messages abandoned by them, {} handled again",
        abandoned.len(),
        handled.values().filter(|n| **n > 1).count()
    );
}

/// `[limits.concurrency."courier.test"] key = "$.text", max = 1` in `courier.toml`: the bus
/// built from the configuration stamps each message with the key its body holds, the Redis
/// transport it is routed to takes `concurrency_max = 1`, and a message whose key is too long is
/// refused at dispatch, naming it (nothing stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn keys_from_config_limit_a_message_type() {
    let url = courier_test::env::redis_url();
    let stream = courier_test::env::unique_name("courier_flow");
    let cleanup = courier_test::Cleanup::new();
    cleanup.redis_keys(&url, &stream);
    let config: courier_core::config::Config = format!(
        "[transports.jobs]\ndsn = \"{url}?stream={stream}&poll_window=200ms\"\n\
         [routing]\n\"courier.test\" = \"jobs\"\n\
         [limits.concurrency.\"courier.test\"]\nkey = \"$.text\"\nmax = 1\n"
    )
    .parse()
    .unwrap();
    let factories =
        courier_core::TransportRegistry::new().with(Arc::new(courier_redis::RedisTransportFactory));
    let registry = Arc::new(courier_core::MessageRegistry::new().with::<TestMessage>());
    let transports = timeout(config.connect(&factories, registry)).await.unwrap();
    let bus = transports.bus_builder().build();
    let tenant = |seq, text: &str| TestMessage {
        seq,
        text: text.to_owned(),
    };
    for (seq, text) in [(1, "t1"), (2, "t1"), (3, "t2")] {
        timeout(bus.dispatch(tenant(seq, text))).await.unwrap();
    }
    let err = timeout(bus.dispatch(tenant(4, &"x".repeat(201))))
        .await
        .unwrap_err();
    let chain = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ");
    assert!(
        chain.contains("message `courier.test`: concurrency_key `$.text`: ")
            && chain.contains("201 bytes, expected at most 200"),
        "{chain}"
    );
    let jobs = transports.get("jobs").unwrap();
    let mut got = timeout(jobs.get(10)).await.unwrap();
    got.sort_by_key(seq);
    assert_eq!(seqs(&got), vec![1, 3], "one per key: t1's second waits");
    assert_eq!(key_of(&got[0]), "t1");
    timeout(jobs.ack_batch(&got)).await.unwrap();
    let got = timeout(jobs.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![2]);
    timeout(jobs.ack_batch(&got)).await.unwrap();
    assert_eq!(
        timeout(jobs.as_message_count().unwrap().message_count())
            .await
            .unwrap(),
        0,
        "nothing else was stored"
    );
}

/// A keyed delivery's keepalive renews its lease (an ended lease renewed in time is not
/// delivered again) and a superseded one's renews nothing; a lease that is not a delivery and a
/// delayed message whose key is lost are what a corrupt or foreign write leaves: the claim
/// drops the first and delivers the second (unlimited) rather than failing or losing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn keepalive_renews_a_keyed_lease_and_corrupt_entries_lose_nothing() {
    let q = Queue::new(|o| o.concurrency_max(1));
    let holder = q.worker().await;
    let other = q.worker().await;
    timeout(holder.send_batch(vec![keyed(1, "k")]))
        .await
        .unwrap();
    let got = timeout(holder.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![1]);
    q.expire_leases().await;
    timeout(holder.keepalive(&got[0])).await.unwrap();
    assert!(
        timeout(other.get(10)).await.unwrap().is_empty(),
        "the renewed lease still holds the message and its key's slot"
    );

    let mut conn = q.conn().await;
    let _: () = redis::cmd("ZADD")
        .arg(q.key("leases"))
        .arg(0)
        .arg("not a delivery")
        .query_async(&mut conn)
        .await
        .unwrap();
    let sent = timeout(holder.send_batch(vec![
        keyed(2, "j").with(courier_core::DelayStamp(Duration::from_millis(200))),
    ]))
    .await
    .unwrap();
    let id = sent[0]
        .last::<courier_core::TransportMessageIdStamp>()
        .unwrap()
        .0
        .clone();
    let lost: u64 = redis::cmd("HDEL")
        .arg(q.key("key"))
        .arg(&id)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(lost, 1, "a delayed message's key is stored until it is due");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let due = timeout(other.get(10)).await.unwrap();
    assert_eq!(seqs(&due), vec![2], "the delayed message, its key lost");
    let garbage: Option<f64> = redis::cmd("ZSCORE")
        .arg(q.key("leases"))
        .arg("not a delivery")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        garbage, None,
        "the claim dropped the lease that is no delivery"
    );
    timeout(other.ack(&due[0])).await.unwrap();

    // Superseded: the holder's lease ends and the other worker takes the message again.
    q.expire_leases().await;
    let again = timeout(other.get(10)).await.unwrap();
    assert_eq!(
        seqs(&again),
        vec![1],
        "delivered again once its lease ended"
    );
    q.expire_leases().await;
    timeout(holder.keepalive(&got[0])).await.unwrap();
    timeout(holder.ack(&got[0])).await.unwrap();
    let third = timeout(holder.get(10)).await.unwrap();
    assert_eq!(
        seqs(&third),
        vec![1],
        "the superseded keepalive renewed nothing and its ack settled nothing"
    );
    timeout(holder.ack(&third[0])).await.unwrap();
    assert_eq!(count(&holder).await, 0);
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
}

/// A delivery an earlier Courier made (its lease the bare id, its owner and key in hashes of
/// their own) is taken over when its lease ends, holding its slot, and settles clean: workers
/// of the previous layout stopped before these started lose nothing in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn a_delivery_of_the_earlier_layout_is_taken_over() {
    let q = Queue::new(|o| o.concurrency_max(1));
    let w = q.worker().await;
    let sent = timeout(w.send_batch(vec![keyed(7, "t")])).await.unwrap();
    let id = sent[0]
        .last::<courier_core::TransportMessageIdStamp>()
        .unwrap()
        .0
        .clone();
    // What an earlier worker's claim left: the id off its list, an ended lease, owner and key.
    let mut conn = q.conn().await;
    let () = redis::pipe()
        .cmd("LPOP")
        .arg(q.key("q:t"))
        .ignore()
        .cmd("ZADD")
        .arg(q.key("leases"))
        .arg(0)
        .arg(&id)
        .ignore()
        .cmd("HSET")
        .arg(q.key("owner"))
        .arg(&id)
        .arg("gone\n1")
        .ignore()
        .cmd("HSET")
        .arg(q.key("key"))
        .arg(&id)
        .arg("t")
        .ignore()
        .cmd("HINCRBY")
        .arg(q.key("busy"))
        .arg("t")
        .arg(1)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let got = timeout(w.get(10)).await.unwrap();
    assert_eq!(seqs(&got), vec![7]);
    assert_eq!(
        got[0]
            .last::<courier_core::DeliveryTagStamp>()
            .map(|t| t.0.clone()),
        Some("2\nt".to_owned()),
        "its second delivery, of key t"
    );
    assert_eq!(
        q.slots().await.0.get("t"),
        Some(&1),
        "the same slot, held once"
    );
    timeout(w.ack(&got[0])).await.unwrap();
    assert_eq!(count(&w).await, 0);
    assert_eq!(q.slots().await, (HashMap::new(), 0), "every slot free");
    let left: (u64, u64) = redis::pipe()
        .cmd("HLEN")
        .arg(q.key("owner"))
        .cmd("HLEN")
        .arg(q.key("key"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, (0, 0), "nothing of the earlier layout left");
}
