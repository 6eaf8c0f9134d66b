//! Flow control per key on every dialect: `concurrency_max` holds across workers with pools of
//! their own (separate processes, as far as the database can tell), a dead worker's slot frees
//! itself when its lease runs out, bad keys and options get clear errors, and `fair=true` claims
//! round-robin across keys so that one key's backlog does not starve the others (pickup latency
//! p99 printed beside plain FIFO's).

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier_core::{ConcurrencyKeyStamp, Envelope, Transport};
use courier_sql::SqlTransport;
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

const WORKERS: usize = 6;
const KEYS: u64 = 20;
const MESSAGES: u64 = 600;
const MAX: usize = 3;
const KILL_EVERY_MS: u64 = 100;

/// 6 workers, each on a pool of its own, 600 messages over 20 keys, at most 3 per key: sampled
/// in the handler, never more than 3 of a key between claim and ack; every message handled
/// once; some key does reach 3 (the limit is used, not just respected by a serial run).
async fn at_most_max_per_key_are_in_flight_across_workers(h: &common::SqlHarness) {
    let (most, limited) = run_workers(h, &format!("&concurrency_max={MAX}")).await;
    let over: Vec<_> = most.iter().filter(|(_, n)| **n > MAX).collect();
    assert!(over.is_empty(), "more than {MAX} in flight: {over:?}");
    assert!(
        most.values().any(|n| *n == MAX),
        "no key ever had {MAX} in flight: {most:?}"
    );
    let (most, unlimited) = run_workers(h, "").await;
    assert!(
        most.values().any(|n| *n > MAX),
        "the same run without a limit goes over {MAX} (the check can fail): {most:?}"
    );
    println!(
        "{MESSAGES} messages over {KEYS} keys by {WORKERS} workers: concurrency_max={MAX} {limited:?}, \
         unlimited {unlimited:?}"
    );
}

/// Runs the workers on a fresh table with `options`; returns the most in flight seen per key
/// and the time it took.
async fn run_workers(h: &common::SqlHarness, options: &str) -> (HashMap<String, usize>, Duration) {
    let (first, table) = h.make(options).await;
    let batch: Vec<Envelope> = (0..MESSAGES)
        .map(|i| keyed(i, &format!("tenant-{}", i % KEYS)))
        .collect();
    timeout(first.send_batch(batch)).await.unwrap();
    let mut workers: Vec<Arc<SqlTransport>> = vec![first];
    for _ in 1..WORKERS {
        workers.push(h.reuse_with(&table, options).await);
    }
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let most: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in workers {
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
                // The handler's work, with the messages held.
                tokio::time::sleep(Duration::from_millis(fastrand::u64(20..60))).await;
                for e in &got {
                    *in_flight.lock().unwrap().get_mut(&key_of(e)).unwrap() -= 1;
                    let seq = e.message::<TestMessage>().unwrap().seq;
                    *handled.lock().unwrap().entry(seq).or_default() += 1;
                }
                timeout(t.ack_batch(&got)).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let most = most.lock().unwrap().clone();
    let handled = handled.lock().unwrap().clone();
    assert_eq!(handled.len() as u64, MESSAGES);
    let twice: Vec<_> = handled.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(h.admin.count(&table).await, 0);
    (most, elapsed)
}

/// A worker that dies holding a key's only slot (max 1): its pool closed, nothing acked. The
/// key's other message waits, and another worker gets nothing of that key while the lease
/// lives; once it runs out, the slot is free: the dead worker's message is redelivered first
/// (FIFO inside the key), and the next one still waits for its ack.
async fn a_dead_workers_slot_frees_itself_when_its_lease_ends(h: &common::SqlHarness) {
    let options = "&concurrency_max=1&redeliver_timeout=2s";
    let (first, table) = h.make(options).await;
    timeout(first.send_batch(vec![keyed(1, "k"), keyed(2, "k"), keyed(3, "other")]))
        .await
        .unwrap();
    let doomed = h.reuse_with(&table, options).await;
    let got = timeout(doomed.get(10)).await.unwrap();
    let seqs: Vec<u64> = got
        .iter()
        .map(|e| e.message::<TestMessage>().unwrap().seq)
        .collect();
    assert_eq!(seqs, vec![1, 3], "one of key k, one of key other");
    timeout(doomed.ack(&got[1])).await.unwrap();
    // The worker dies: its connections close, message 1 is never acked.
    drop(got);
    drop(doomed);
    let survivor = h.reuse_with(&table, options).await;
    let none = timeout(survivor.get(10)).await.unwrap();
    assert!(
        none.is_empty(),
        "key k's slot is held by the dead worker's live lease"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let redelivered = loop {
        let got = timeout(survivor.get(10)).await.unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "the dead worker's slot never came back"
        );
    };
    let seqs: Vec<u64> = redelivered
        .iter()
        .map(|e| e.message::<TestMessage>().unwrap().seq)
        .collect();
    assert_eq!(
        seqs,
        vec![1],
        "the dead worker's message, alone: message 2 waits for its slot"
    );
    timeout(survivor.ack(&redelivered[0])).await.unwrap();
    let next = timeout(survivor.get(10)).await.unwrap();
    let seqs: Vec<u64> = next
        .iter()
        .map(|e| e.message::<TestMessage>().unwrap().seq)
        .collect();
    assert_eq!(seqs, vec![2], "the ack freed the slot");
    timeout(survivor.ack(&next[0])).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}

/// Bad options fail at connect naming the option; a message whose key path is missing, not a
/// string, or too long is refused at send naming the path (nothing stored, nothing stuck); a
/// good message still goes through; the key comes from the body when no stamp overrides it.
async fn bad_keys_and_options_get_clear_errors(h: &common::SqlHarness) {
    let table = h.table("courier_t");
    for (options, expected) in [
        ("&concurrency_max=0", "concurrency_max must be at least 1"),
        (
            "&concurrency_max=2&concurrency_key=tenant_id",
            "concurrency_key `tenant_id`: expected a JSON path",
        ),
        (
            "&concurrency_max=2&concurrency_key=$.a..b",
            "concurrency_key `$.a..b`: expected a JSON path",
        ),
        (
            "&concurrency_key=$.text",
            "concurrency_key needs concurrency_max=N or fair=true",
        ),
    ] {
        let dsn = format!("{}?table_name={table}{}{options}", h.base, h.extra);
        let dsn = courier_core::Dsn::parse(&dsn).unwrap();
        let err = SqlTransport::connect("jobs", &dsn, courier_test::registry())
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| panic!("{options} was accepted"));
        assert!(err.contains(expected), "{options}: {err}");
    }
    let (t, table) = h.make("&concurrency_max=1&concurrency_key=$.text").await;
    let (missing, _) = h.make("&concurrency_max=1&concurrency_key=$.tenant").await;
    let err = missing
        .send(Envelope::new(TestMessage::new(1)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("concurrency_key `$.tenant`: missing from the message")
            && err.contains("courier.test"),
        "{err}"
    );
    let (number, _) = h.make("&concurrency_max=1&concurrency_key=$.seq").await;
    let err = number
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
    assert!(ConcurrencyKeyStamp::new("").is_err());
    assert!(ConcurrencyKeyStamp::new("k".repeat(201)).is_err());
    assert!(ConcurrencyKeyStamp::new("k".repeat(200)).is_ok());
    assert_eq!(h.admin.count(&table).await, 0, "nothing stored");
    // The key comes from the body: two messages with the same text share one slot, a stamp
    // overrides the body.
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
    let got = timeout(t.get(10)).await.unwrap();
    let seqs: Vec<u64> = got
        .iter()
        .map(|e| e.message::<TestMessage>().unwrap().seq)
        .collect();
    assert_eq!(seqs, vec![1, 3]);
    timeout(t.ack_batch(&got)).await.unwrap();
    let got = timeout(t.get(10)).await.unwrap();
    assert_eq!(got.len(), 1);
    timeout(t.ack_batch(&got)).await.unwrap();
}

const BACKLOG: u64 = 20_000;
const OTHERS: [&str; 10] = ["B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];
const EACH: u64 = 100;

/// Consumes until every B-K message is handled; returns how many of A's were handled by then
/// and the B-K pickup latencies (from their send to their handling).
async fn consume_until_the_others_are_done(
    t: &SqlTransport,
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
/// is handled before 10 % of A's backlog is. The same run in plain FIFO order serves A's whole
/// backlog first; both B-K pickup latency p99s are printed.
async fn fair_claims_serve_every_tenant_before_a_tenth_of_a_backlog(h: &common::SqlHarness) {
    let mut p99s = Vec::new();
    for fair in [true, false] {
        let options = if fair { "&fair=true" } else { "" };
        let (t, _table) = h.make(options).await;
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
            "{}: B-K pickup latency p99 {p99:?}, A handled before B-K were done: {a_handled}",
            if fair { "fair=true" } else { "FIFO" }
        );
    }
}

/// What one worker holds: decremented from the per-key count when its handler is done, or
/// when the worker is killed holding it (then its messages are abandoned: they may be handled
/// again once their lease runs out).
struct Held {
    keys: Vec<String>,
    seqs: Vec<u64>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    abandoned: Arc<Mutex<std::collections::HashSet<u64>>>,
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

/// The concurrency run with workers killed: every 400 ms one of 4 workers is aborted
/// mid-batch and its pool dropped (to the database, a killed process: its deliveries are never
/// acked), and a new worker with a pool of its own takes its place. Sampled in the handler,
/// never more than 3 of a key in flight; every message is acked in the end, handled more than
/// once only if a killed worker held it; the table is empty, so no slot is held.
async fn killed_workers_leak_no_slot(h: &common::SqlHarness) {
    const LIVE: usize = 4;
    let options = format!("&concurrency_max={MAX}&redeliver_timeout=2s");
    let (first, table) = h.make(&options).await;
    let batch: Vec<Envelope> = (0..MESSAGES)
        .map(|i| keyed(i, &format!("tenant-{}", i % KEYS)))
        .collect();
    timeout(first.send_batch(batch)).await.unwrap();
    let in_flight: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let most: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let handled: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let acked: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
    let abandoned: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
    let spawn = |t: Arc<SqlTransport>| {
        let (in_flight, most, handled, acked, abandoned) = (
            in_flight.clone(),
            most.clone(),
            handled.clone(),
            acked.clone(),
            abandoned.clone(),
        );
        tokio::spawn(async move {
            loop {
                let got = timeout(t.get(10)).await.unwrap();
                let mut held = Held {
                    keys: got.iter().map(key_of).collect(),
                    seqs: got
                        .iter()
                        .map(|e| e.message::<TestMessage>().unwrap().seq)
                        .collect(),
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
                acked.lock().unwrap().extend(&held.seqs);
            }
        })
    };
    let mut workers = vec![spawn(first)];
    for _ in 1..LIVE {
        workers.push(spawn(h.reuse_with(&table, &options).await));
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut kills = 0;
    // Until the table is empty: a worker killed after its ack committed but before it noted
    // the ack is done with its messages all the same.
    while h.admin.count(&table).await > 0 {
        assert!(Instant::now() < deadline, "not every message was acked");
        tokio::time::sleep(Duration::from_millis(KILL_EVERY_MS)).await;
        let victim = fastrand::usize(..LIVE);
        workers[victim].abort();
        kills += 1;
        let replacement = spawn(h.reuse_with(&table, &options).await);
        workers[victim] = replacement;
    }
    for w in &workers {
        w.abort();
    }
    for w in workers {
        let _ = w.await;
    }
    let most = most.lock().unwrap().clone();
    let over: Vec<_> = most.iter().filter(|(_, n)| **n > MAX).collect();
    assert!(over.is_empty(), "more than {MAX} in flight: {over:?}");
    let handled = handled.lock().unwrap().clone();
    let abandoned = abandoned.lock().unwrap().clone();
    assert_eq!(handled.len() as u64, MESSAGES, "every message handled");
    let again: Vec<_> = handled
        .iter()
        .filter(|(seq, n)| **n > 1 && !abandoned.contains(seq))
        .collect();
    assert!(again.is_empty(), "handled twice without a kill: {again:?}");
    assert_eq!(
        h.admin.count(&table).await,
        0,
        "every message acked, every slot free"
    );
    println!(
        "{kills} workers killed; {} messages abandoned by them, {} handled again",
        abandoned.len(),
        handled.values().filter(|n| **n > 1).count()
    );
}

/// `courier stats --keys`, the dashboard and the per-key gauges read a keyed queue's loads:
/// per key, its messages in flight (delivered under a live lease) and queued (ready: delayed
/// and plain messages not counted), the busiest first, the rest as `other`. A plain queue does
/// not offer them.
async fn a_keyed_queue_reports_each_keys_load(h: &common::SqlHarness) {
    let (plain, _) = h.make("").await;
    assert!(
        (plain.clone() as Arc<dyn Transport>)
            .as_keyed_queue()
            .is_none(),
        "a plain queue has no keys"
    );
    let (queue, _) = h.make("&concurrency_max=1").await;
    let delayed = keyed(6, "c").with(courier_core::DelayStamp(Duration::from_secs(3600)));
    timeout(queue.send_batch(vec![
        keyed(1, "a"),
        keyed(2, "a"),
        keyed(3, "a"),
        keyed(4, "b"),
        keyed(5, "b"),
        delayed,
        Envelope::new(TestMessage::new(7)),
    ]))
    .await
    .unwrap();
    let got = timeout(queue.get(10)).await.unwrap();
    let mut keys: Vec<String> = got.iter().map(key_of).collect();
    keys.sort();
    assert_eq!(keys, ["", "a", "b"], "one of each key, and the plain one");
    let dyn_queue = queue.clone() as Arc<dyn Transport>;
    let keyed_queue = dyn_queue.as_keyed_queue().expect("a keyed queue");
    let loads = timeout(keyed_queue.key_loads(10)).await.unwrap();
    let load = |key: &str, in_flight, queued| courier_core::KeyLoad {
        key: key.to_owned(),
        in_flight,
        queued,
    };
    assert_eq!(loads.max, Some(1));
    assert_eq!(loads.keys, [load("a", 1, 2), load("b", 1, 1)]);
    assert_eq!((loads.other, loads.other_keys), (None, 0));
    let top = timeout(keyed_queue.key_loads(1)).await.unwrap();
    assert_eq!(top.keys, [load("a", 1, 2)]);
    assert_eq!(top.other, Some(load("other", 1, 1)));
    // Acked, the slot is free and the next of the key is queued, not in flight.
    let a = got.iter().find(|e| key_of(e) == "a").unwrap();
    timeout(queue.ack(a)).await.unwrap();
    let loads = timeout(keyed_queue.key_loads(10)).await.unwrap();
    assert_eq!(loads.keys, [load("b", 1, 1), load("a", 0, 2)]);
}

/// A claim ranks the queue's FIFO head first (on PostgreSQL a head sized to the claim, 128
/// rows for this one); when that head is all one full key, the rest of the claim comes from
/// the whole queue: 300 messages of key `a`, then one each of `b` to `f`, at most 2 per key. A
/// claim of 10 takes 2 of `a` and every other key's message.
async fn a_head_taken_by_a_full_key_does_not_hide_the_others(h: &common::SqlHarness) {
    let (transport, table) = h.make("&concurrency_max=2").await;
    let mut batch: Vec<Envelope> = (0..300).map(|seq| keyed(seq, "a")).collect();
    batch.extend(
        ["b", "c", "d", "e", "f"]
            .iter()
            .zip(300..)
            .map(|(k, seq)| keyed(seq, k)),
    );
    timeout(transport.send_batch(batch)).await.unwrap();
    let got = timeout(transport.get(10)).await.unwrap();
    let mut keys: Vec<String> = got.iter().map(key_of).collect();
    keys.sort();
    assert_eq!(keys, ["a", "a", "b", "c", "d", "e", "f"]);
    timeout(transport.ack_batch(&got)).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 298);
}

macro_rules! on_every_dialect {
    ($($case:ident),*) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::common::sqlite().await).await;
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
                async fn $case() {
                    super::$case(&crate::common::postgres().await).await;
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
                async fn $case() {
                    super::$case(&crate::common::mysql().await).await;
                }
            )*
        }
    };
}

on_every_dialect!(
    a_head_taken_by_a_full_key_does_not_hide_the_others,
    a_keyed_queue_reports_each_keys_load,
    at_most_max_per_key_are_in_flight_across_workers,
    a_dead_workers_slot_frees_itself_when_its_lease_ends,
    bad_keys_and_options_get_clear_errors,
    fair_claims_serve_every_tenant_before_a_tenth_of_a_backlog,
    killed_workers_leak_no_slot
);

/// PostgreSQL: a worker waiting for a full key's slot is woken by the ack that frees it (a
/// `NOTIFY`), not by polling: its poll window is 60 s, as is the lease, and the only due time
/// it could wake for is the lease's end. Without the notification its `get` would return at
/// the window's end (60 s); with it, it returns within 15 s (in practice milliseconds).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_an_ack_wakes_a_worker_waiting_for_the_slot() {
    let h = common::postgres().await;
    let options = "&concurrency_max=1&redeliver_timeout=60s";
    let (holder, table) = h.make(options).await;
    timeout(holder.send_batch(vec![keyed(1, "k"), keyed(2, "k")]))
        .await
        .unwrap();
    let held = timeout(holder.get(10)).await.unwrap();
    assert_eq!(held.len(), 1, "one slot");
    let waiter = h
        .reuse_with(&table, &format!("{options}&poll_window=60s"))
        .await;
    let waiting = tokio::spawn(async move { waiter.get(10).await.unwrap() });
    // Let the waiter claim nothing and settle into its wait before the ack.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the key is full: the waiter waits");
    timeout(holder.ack(&held[0])).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the ack did not wake the waiting worker")
        .unwrap();
    let seqs: Vec<u64> = got
        .iter()
        .map(|e| e.message::<TestMessage>().unwrap().seq)
        .collect();
    assert_eq!(seqs, vec![2], "woken within its poll window by the ack");
}

/// PostgreSQL: a keyed claim goes as one simple query, its values written as literals into
/// statements prepared per session: a queue named with a quote and a backslash is that queue
/// on every claim (and nobody else's), and a session killed between two claims (its prepared
/// statements gone with it) is replaced by one that prepares them again.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_a_keyed_claim_quotes_its_queue_and_prepares_a_new_session_again() {
    let h = common::postgres().await;
    let marker = h.table("quoted");
    let queue = format!("it's a \\ {marker}");
    let encoded = queue
        .replace('\'', "%27")
        .replace('\\', "%5C")
        .replace(' ', "%20");
    let (transport, table) = h
        .make(&format!(
            "&concurrency_max=1&max_connections=1&queue_name={encoded}"
        ))
        .await;
    let batch = ["a", "a", "b", "b"]
        .iter()
        .zip(0..)
        .map(|(k, seq)| keyed(seq, k));
    timeout(transport.send_batch(batch.collect()))
        .await
        .unwrap();
    // One session of the harness's for the checks below, so that the only other sessions
    // whose last statement names the table or the queue are the transport's.
    let mut admin = h.admin.postgres().acquire().await.unwrap();
    let first = timeout(transport.get(10)).await.unwrap();
    let mut keys: Vec<String> = first.iter().map(key_of).collect();
    keys.sort();
    assert_eq!(keys, ["a", "b"], "one of each key");
    let delivered: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM {table} WHERE queue_name = $1 AND delivered_at IS NOT NULL"
    ))
    .bind(&queue)
    .fetch_one(&mut *admin)
    .await
    .unwrap();
    assert_eq!(delivered, 2, "claimed on the queue named {queue:?}");
    // Both keys are full: this claim finds nothing, and leaves the transport's session with a
    // last statement that names the queue (the claim) or the table (its next due time).
    assert!(timeout(transport.get(10)).await.unwrap().is_empty());
    // The transport's session: its last statement named its table or its queue.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE (query LIKE '%' || $1 || '%' OR query LIKE '%' || $2 || '%') \
         AND pid <> pg_backend_pid()",
    )
    .bind(&marker)
    .bind(&table)
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    assert_eq!(killed, [true], "the transport's one session");
    timeout(transport.ack_batch(&first)).await.unwrap();
    let second = timeout(transport.get(10)).await.unwrap();
    let mut keys: Vec<String> = second.iter().map(key_of).collect();
    keys.sort();
    assert_eq!(keys, ["a", "b"], "the rest, on a new session");
    timeout(transport.ack_batch(&second)).await.unwrap();
    // The new session prepared the statements on its first claim: the next is the one query.
    let batch = ["a", "c"].iter().zip(10..).map(|(k, seq)| keyed(seq, k));
    timeout(transport.send_batch(batch.collect()))
        .await
        .unwrap();
    let third = timeout(transport.get(10)).await.unwrap();
    assert_eq!(third.len(), 2);
    let last: Vec<String> = sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity WHERE query LIKE '%' || $1 || '%' \
         AND pid <> pg_backend_pid()",
    )
    .bind(&marker)
    .fetch_all(&mut *admin)
    .await
    .unwrap();
    drop(admin);
    assert!(
        last.len() == 1 && last[0].starts_with("EXECUTE courier_"),
        "the claim went as one query of prepared statements: {last:?}"
    );
    timeout(transport.ack_batch(&third)).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}
