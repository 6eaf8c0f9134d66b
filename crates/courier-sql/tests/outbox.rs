//! The transactional outbox and the inbox on every dialect: a message dispatched with
//! `dispatch_in` exists exactly when the caller's transaction commits (a rolled-back one is
//! never delivered); an inbox claim made in a transaction exists exactly when it commits, a
//! second claim of the same id answers `false`, the middleware skips recorded ids, and the
//! cleanup drops ids past their retention. A relay from an outbox to a queue of another
//! database delivers the same ids and stamps, in order, and deletes the outbox rows.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use courier_core::relay::{Relay, RelayOptions};
use courier_core::{
    BusError, BusNameStamp, CancellationToken, DelayStamp, Envelope, HandlerError,
    InMemoryTransport, MessageBus, MessageIdStamp, ReceivedStamp, TraceContextStamp, Transport,
    TransportMessageIdStamp,
};
use courier_sql::relay::{CursorLease, CursorPosition, CursorSource};
use courier_sql::{Inbox, InboxOptions, SqlDatabase, SqlTransport, dispatch_in};
use courier_test::TestMessage;

/// Gets everything the queue holds now (a few polls).
async fn drain(t: &SqlTransport) -> Vec<Envelope> {
    let mut all = Vec::new();
    for _ in 0..3 {
        let got = tokio::time::timeout(Duration::from_secs(10), t.get(100))
            .await
            .unwrap()
            .unwrap();
        t.ack_batch(&got).await.unwrap();
        all.extend(got);
    }
    all
}

async fn only_committed_messages_are_sent<DB>(pool: sqlx::Pool<DB>, h: common::SqlHarness)
where
    DB: SqlDatabase,
    DB::Connection: 'static,
{
    let (t, _table) = h.make("").await;
    let bus = MessageBus::builder()
        .transport("outbox", t.clone())
        .transport("memory", Arc::new(InMemoryTransport::new()))
        .route("courier.test", ["outbox"])
        .message::<TestMessage>()
        .build();

    let mut tx = pool.begin().await.unwrap();
    dispatch_in(&bus, &mut tx, TestMessage::new(1))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let sent = dispatch_in(&bus, &mut tx, TestMessage::new(2))
        .await
        .unwrap();
    // Not visible before the commit (SQLite: the open transaction holds the one write lock, so
    // a claim would wait for it).
    if DB::DIALECT != courier_sql::Dialect::Sqlite {
        assert!(t.get(10).await.unwrap().is_empty());
    }
    tx.commit().await.unwrap();

    let got = drain(&t).await;
    let seqs: Vec<u64> = got
        .iter()
        .filter_map(|e| e.message::<TestMessage>().map(|m| m.seq))
        .collect();
    assert_eq!(seqs, [2], "the rolled-back message is never sent");
    assert_eq!(
        got[0].last::<TransportMessageIdStamp>(),
        sent.last::<TransportMessageIdStamp>()
    );
    let id = sent.last::<MessageIdStamp>().unwrap();
    assert_eq!(got[0].last::<MessageIdStamp>(), Some(id));

    // A route to a transport that is not SQL is refused, naming it.
    let mut tx = pool.begin().await.unwrap();
    let refused = dispatch_in(
        &bus,
        &mut tx,
        Envelope::new(TestMessage::new(3))
            .with(courier_core::TransportNamesStamp(vec!["memory".into()])),
    )
    .await
    .unwrap_err();
    match &refused {
        BusError::Send { source, .. } => assert_eq!(source.transport(), "memory"),
        other => panic!("{other}"),
    }
    tx.rollback().await.unwrap();
}

/// Orders committed to an outbox of `pool`'s database (`from`) and relayed to a queue of
/// another database (`to`) arrive there in order, each with the id and stamps it was written
/// with, and leave no outbox row behind.
async fn a_relay_to_another_database_keeps_ids_stamps_and_order<DB>(
    pool: sqlx::Pool<DB>,
    from: common::SqlHarness,
    to: common::SqlHarness,
) where
    DB: SqlDatabase,
    DB::Connection: 'static,
{
    let (outbox, outbox_table) = from.make("").await;
    let (queue, _) = to.make("").await;
    let bus = MessageBus::builder()
        .transport("outbox", outbox.clone())
        .route("courier.test", ["outbox"])
        .message::<TestMessage>()
        .build();
    let mut written = Vec::new();
    for seq in 0..7_u64 {
        let trace = TraceContextStamp {
            traceparent: format!("00-{:032x}-{:016x}-01", seq + 1, seq + 1),
            tracestate: Some(format!("courier=test{seq}")),
        };
        let mut tx = pool.begin().await.unwrap();
        let envelope = Envelope::new(TestMessage::new(seq)).with(trace);
        written.push(dispatch_in(&bus, &mut tx, envelope).await.unwrap());
        tx.commit().await.unwrap();
    }
    let relay = Relay::new("outbox", outbox.clone(), "queue", queue.clone())
        .options(RelayOptions::default().batch_size(3).limit(Some(7)));
    let stats = tokio::time::timeout(Duration::from_secs(60), relay.run(CancellationToken::new()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((stats.relayed, stats.batches), (7, 3));
    assert_eq!(
        from.admin.count(&outbox_table).await,
        0,
        "outbox rows deleted"
    );

    let got = drain(&queue).await;
    let seqs: Vec<u64> = got
        .iter()
        .filter_map(|e| e.message::<TestMessage>().map(|m| m.seq))
        .collect();
    assert_eq!(seqs, (0..7).collect::<Vec<_>>(), "in the outbox's order");
    for (got, written) in got.iter().zip(&written) {
        let id = written.last::<MessageIdStamp>().unwrap();
        assert_eq!(
            got.last::<MessageIdStamp>(),
            Some(id),
            "the same message id"
        );
        assert_eq!(
            got.last::<TraceContextStamp>(),
            written.last::<TraceContextStamp>()
        );
        assert!(got.has::<BusNameStamp>());
        assert_eq!(got.last::<BusNameStamp>(), written.last::<BusNameStamp>());
        assert_eq!(got.all::<MessageIdStamp>().count(), 1, "one id, not two");
    }
}

async fn inbox_claims_commit_with_the_transaction<DB>(pool: sqlx::Pool<DB>, h: &common::SqlHarness)
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    let table = h.table("courier_inbox");
    let inbox = Inbox::new(
        pool.clone(),
        InboxOptions::new(&table)
            .consumer("shipping")
            .cleanup_every(0),
    )
    .await
    .unwrap();
    let envelope = Envelope::new(TestMessage::new(1)).with(MessageIdStamp::new());
    let id = envelope.last::<MessageIdStamp>().unwrap().0.clone();

    let mut tx = pool.begin().await.unwrap();
    assert!(inbox.claim_in(&mut tx, &envelope).await.unwrap());
    tx.rollback().await.unwrap();
    assert!(!inbox.is_recorded(&id).await.unwrap(), "rolled back");

    let mut tx = pool.begin().await.unwrap();
    assert!(inbox.claim_in(&mut tx, &envelope).await.unwrap());
    tx.commit().await.unwrap();
    assert!(inbox.is_recorded(&id).await.unwrap());
    let mut tx = pool.begin().await.unwrap();
    assert!(
        !inbox.claim_in(&mut tx, &envelope).await.unwrap(),
        "handled before"
    );
    tx.rollback().await.unwrap();

    // The middleware: a recorded id is skipped; a new one is handled, then recorded.
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = handled.clone();
    let bus = MessageBus::builder()
        .middleware(inbox.clone())
        .handler_fn("count", move |_: Arc<TestMessage>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let received = |e: Envelope| e.with(ReceivedStamp("orders".into()));
    bus.dispatch(received(envelope.clone())).await.unwrap();
    assert_eq!(handled.load(Ordering::SeqCst), 0, "recorded: skipped");
    let fresh = Envelope::new(TestMessage::new(2)).with(MessageIdStamp::new());
    bus.dispatch(received(fresh.clone())).await.unwrap();
    bus.dispatch(received(fresh.clone())).await.unwrap();
    assert_eq!(handled.load(Ordering::SeqCst), 1, "handled once");

    // Retention: ids older than `retain` go.
    let kept = Inbox::without_setup(
        pool.clone(),
        InboxOptions::new(&table)
            .consumer("shipping")
            .retain(Duration::from_millis(1)),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(kept.cleanup().await.unwrap(), 2);
    assert!(!inbox.is_recorded(&id).await.unwrap());
    assert!(
        Inbox::without_setup(pool, InboxOptions::new("bad name; drop")).is_err(),
        "table names are validated"
    );
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_dispatch_in_sends_only_what_commits() {
    let h = common::sqlite().await;
    let common::Admin::Sqlite(pool) = &h.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    only_committed_messages_are_sent(pool, h).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_dispatch_in_sends_only_what_commits() {
    let h = common::postgres().await;
    let pool = h.admin.postgres();
    let pool = pool.clone();
    only_committed_messages_are_sent(pool, h).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_dispatch_in_sends_only_what_commits() {
    let h = common::mysql().await;
    let common::Admin::MySql(pool) = &h.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    only_committed_messages_are_sent(pool, h).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inbox_claims_commit_with_the_transaction() {
    let h = common::sqlite().await;
    let common::Admin::Sqlite(pool) = &h.admin else {
        unreachable!()
    };
    inbox_claims_commit_with_the_transaction(pool.clone(), &h).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_inbox_claims_commit_with_the_transaction() {
    let h = common::postgres().await;
    let pool = h.admin.postgres();
    inbox_claims_commit_with_the_transaction(pool.clone(), &h).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
async fn mysql_inbox_claims_commit_with_the_transaction() {
    let h = common::mysql().await;
    let common::Admin::MySql(pool) = &h.admin else {
        unreachable!()
    };
    inbox_claims_commit_with_the_transaction(pool.clone(), &h).await;
}

#[cfg(all(feature = "sqlite", feature = "postgres"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_sqlite_outbox_relays_to_a_postgres_queue() {
    let from = common::sqlite().await;
    let common::Admin::Sqlite(pool) = &from.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    a_relay_to_another_database_keeps_ids_stamps_and_order(pool, from, common::postgres().await)
        .await;
}

#[cfg(all(feature = "postgres", feature = "mysql"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL and MySQL/MariaDB: set COURIER_TEST_POSTGRES_URL and COURIER_TEST_MYSQL_URL"]
async fn a_postgres_outbox_relays_to_a_mariadb_queue() {
    let from = common::postgres().await;
    let common::Admin::Postgres(pool) = &from.admin else {
        unreachable!()
    };
    let pool = pool.clone();
    a_relay_to_another_database_keeps_ids_stamps_and_order(pool, from, common::mysql().await).await;
}

/// The sequence numbers of test messages, in order.
fn seqs(envelopes: &[Envelope]) -> Vec<u64> {
    envelopes
        .iter()
        .filter_map(|e| e.message::<TestMessage>().map(|m| m.seq))
        .collect()
}

/// How long the tests' drains may hold their rows.
const HOLD: Duration = Duration::from_secs(60);

/// What a relay reads a PostgreSQL outbox with: drained rows are gone for everyone else while
/// held, come back at once when the hold is dropped (a relay that dies), and are gone for good
/// once committed.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_postgres_drain_holds_its_rows_until_it_commits() {
    let h = common::postgres().await;
    let (t, table) = h.make("").await;
    let batch = messages(0..5);
    t.send_batch(batch).await.unwrap();
    let drain = t.as_drain().expect("a PostgreSQL queue drains");
    let deadline = Duration::from_secs(10);

    let signal = tokio::sync::Notify::new();
    let held = tokio::time::timeout(deadline, drain.drain(3, HOLD, &signal))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&held.envelopes), [0, 1, 2], "in the queue's order");
    tokio::time::timeout(Duration::from_millis(1), signal.notified())
        .await
        .expect("a drain that took rows said when it held them");
    let rest = tokio::time::timeout(deadline, t.get(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&rest), [3, 4], "held rows are not handed out again");
    t.ack_batch(&rest).await.unwrap();
    let silent = tokio::sync::Notify::new();
    let none = tokio::time::timeout(deadline, drain.drain(10, HOLD, &silent))
        .await
        .unwrap()
        .unwrap();
    assert!(none.is_empty(), "a second drain skips the held rows");
    assert!(
        tokio::time::timeout(Duration::from_millis(50), silent.notified())
            .await
            .is_err(),
        "an empty drain holds nothing, and says nothing"
    );

    // Dropped without a commit (the relay died): the rows are back, in order.
    drop(held);
    let mut again = Vec::new();
    let mut hold = None;
    for _ in 0..20 {
        let d = tokio::time::timeout(deadline, drain.drain(10, HOLD, &silent))
            .await
            .unwrap()
            .unwrap();
        if !d.is_empty() {
            again = d.envelopes.clone();
            hold = Some(d);
            break;
        }
    }
    assert_eq!(seqs(&again), [0, 1, 2], "a dropped hold puts its rows back");
    hold.expect("drained again").commit().await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0, "committed rows are gone");
    let after = tokio::time::timeout(deadline, t.get(10))
        .await
        .unwrap()
        .unwrap();
    assert!(after.is_empty(), "nothing comes back after the commit");
}

/// A drain whose holder goes silent (a relay cut off from the server by a network partition:
/// it cannot roll back, and the server would wait for TCP keepalives, hours) is ended by the
/// server once idle past its `hold_for`: the rows come back for another relay, and the
/// silent holder's late commit fails rather than deleting them.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_silent_postgres_drain_gives_its_rows_back_after_its_hold() {
    let h = common::postgres().await;
    let (t, table) = h.make("").await;
    t.send_batch(messages(0..4)).await.unwrap();
    let drain = t.as_drain().expect("a PostgreSQL queue drains");
    let deadline = Duration::from_secs(10);
    let signal = tokio::sync::Notify::new();
    let silent = tokio::time::timeout(deadline, drain.drain(10, Duration::from_secs(3), &signal))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&silent.envelopes), [0, 1, 2, 3]);
    let other = tokio::time::timeout(deadline, drain.drain(10, HOLD, &signal))
        .await
        .unwrap()
        .unwrap();
    assert!(
        other.is_empty(),
        "held rows are skipped while the hold lasts"
    );

    let started = std::time::Instant::now();
    let back = loop {
        let d = tokio::time::timeout(deadline, drain.drain(10, HOLD, &signal))
            .await
            .unwrap()
            .unwrap();
        if !d.is_empty() {
            break d;
        }
        assert!(
            started.elapsed() < deadline,
            "the server never ended the silent hold"
        );
    };
    assert_eq!(seqs(&back.envelopes), [0, 1, 2, 3], "back, in order");
    assert!(
        silent.commit().await.is_err(),
        "the silent holder's transaction was ended: its commit cannot delete the rows"
    );
    assert_eq!(h.admin.count(&table).await, 4, "the rows are still there");
    back.commit().await.unwrap();
    assert_eq!(h.admin.count(&table).await, 0);
}

/// A destination whose sends fail (a transient connection error) while `down`, and take
/// `delay` each when up.
#[derive(Debug)]
struct Outage {
    down: std::sync::atomic::AtomicBool,
    refused: AtomicUsize,
    delay: Duration,
    inner: InMemoryTransport,
}

#[courier_core::async_trait]
impl Transport for Outage {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, courier_core::TransportError> {
        self.send_batch(vec![envelope])
            .await
            .map(|mut sent| sent.remove(0))
    }

    async fn send_batch(
        &self,
        envelopes: Vec<Envelope>,
    ) -> Result<Vec<Envelope>, courier_core::TransportError> {
        if self.down.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(courier_core::TransportError::new(
                courier_core::TransportErrorKind::Connection,
                "dest",
            )
            .with_context("the destination is down"));
        }
        tokio::time::sleep(self.delay).await;
        self.inner.send_batch(envelopes).await
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, courier_core::TransportError> {
        self.inner.get(max).await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), courier_core::TransportError> {
        self.inner.ack(envelope).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), courier_core::TransportError> {
        self.inner.reject(envelope).await
    }

    fn capabilities(&self) -> courier_core::Capabilities {
        self.inner.capabilities()
    }
}

/// A destination down longer than the hold limit: the relay gives its held batches back to
/// the PostgreSQL outbox (no row stays locked, no transaction stays open through the outage),
/// waits the outage out resending from memory, then forwards every message once, in order.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_long_destination_outage_holds_no_outbox_rows() {
    let h = common::postgres().await;
    let common::Admin::Postgres(admin) = &h.admin else {
        unreachable!()
    };
    let (t, table) = h.make("").await;
    let batch = messages(0..30);
    t.send_batch(batch).await.unwrap();
    let dest = Arc::new(Outage {
        down: true.into(),
        refused: AtomicUsize::new(0),
        delay: Duration::ZERO,
        inner: InMemoryTransport::new(),
    });
    let relay = Relay::new("outbox", t.clone(), "dest", dest.clone()).options(
        RelayOptions::default()
            .batch_size(10)
            .limit(Some(30))
            .hold_limit(Duration::from_millis(300))
            .backoff(courier_core::Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(50),
            )),
    );
    let running = tokio::spawn(async move { relay.run(CancellationToken::new()).await });

    // Rows a claim could take now: all of them, once the held batches went back.
    let unlocked =
        format!("SELECT COUNT(*) FROM (SELECT id FROM {table} FOR UPDATE SKIP LOCKED) AS free");
    let free = || async {
        let mut tx = admin.begin().await.unwrap();
        let n: i64 = sqlx::query_scalar(&unlocked)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        n
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        dest.refused.load(Ordering::SeqCst) > 3,
        "the relay kept trying"
    );
    assert_eq!(
        free().await,
        30,
        "no outbox row stays held through the outage"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(free().await, 30, "nor is one drained again while it lasts");

    dest.down.store(false, Ordering::SeqCst);
    relayed_in_order(running, &dest, 30, &h, &table).await;
}

/// Drains overlap (the next starts once the one before holds its rows) yet the destination
/// receives the outbox in its order: 2,000 messages in batches of 50 to a destination slow
/// enough that drains wait ahead of it, while a writer keeps adding to the outbox.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn overlapping_drains_keep_the_outbox_order() {
    relays_in_order_while_written("").await;
}

/// Relays 2,000 messages from a PostgreSQL outbox made with `options` in batches of 50, to a
/// destination slow enough that reads wait ahead of it: 1,000 written before the relay starts,
/// the rest while it runs. Every message arrives once, in order, and the outbox ends empty.
#[cfg(feature = "postgres")]
async fn relays_in_order_while_written(options: &str) {
    let h = common::postgres().await;
    let (t, table) = h.make(options).await;
    t.send_batch(messages(0..1_000)).await.unwrap();
    let dest = Arc::new(Outage {
        down: false.into(),
        refused: AtomicUsize::new(0),
        delay: Duration::from_millis(2),
        inner: InMemoryTransport::new(),
    });
    let relay = Relay::new("outbox", t.clone(), "dest", dest.clone())
        .options(RelayOptions::default().batch_size(50).limit(Some(2_000)));
    let running = tokio::spawn(async move { relay.run(CancellationToken::new()).await });
    for start in (1_000..2_000_u64).step_by(100) {
        t.send_batch(messages(start..start + 100)).await.unwrap();
    }
    relayed_in_order(running, &dest, 2_000, &h, &table).await;
}

/// Test messages numbered `seqs`.
fn messages(seqs: std::ops::Range<u64>) -> Vec<Envelope> {
    seqs.map(|seq| Envelope::new(TestMessage::new(seq)))
        .collect()
}

/// Waits (20 s at most) for the relay `running` to finish, then checks it forwarded messages
/// `0..n` to `dest`, each once and in order, and left the outbox `table` empty.
async fn relayed_in_order(
    running: tokio::task::JoinHandle<
        Result<courier_core::relay::RelayStats, courier_core::TransportError>,
    >,
    dest: &Outage,
    n: u64,
    h: &common::SqlHarness,
    table: &str,
) {
    let stats = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the relay finishes")
        .unwrap()
        .unwrap();
    assert_eq!(stats.relayed, n);
    assert_eq!(
        seqs(&dest.inner.sent()),
        (0..n).collect::<Vec<_>>(),
        "every message once, in the outbox's order"
    );
    assert_eq!(h.admin.count(table).await, 0, "the outbox is empty");
}

/// A cursor outbox (`cursor=true`) relayed while a writer keeps adding to it: every message
/// once, in order, and the outbox empty behind the relay (each move of the cursor deletes the
/// rows it passed).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_cursor_outbox_relays_in_order_and_empties_behind_itself() {
    let h = common::postgres().await;
    let (t, _) = h.make("&cursor=true").await;
    assert!(t.as_cursor().is_some(), "cursor=true reads by a cursor");
    assert!(t.as_drain().is_none(), "and only by it");
    assert!(
        h.make("").await.0.as_cursor().is_none(),
        "a plain queue has no cursor"
    );
    relays_in_order_while_written("&cursor=true").await;
    // Workers would take rows from under the cursor: a cursor outbox refuses them, saying why.
    let err = t.get(10).await.unwrap_err();
    assert_eq!(err.kind(), courier_core::TransportErrorKind::Unsupported);
    assert!(err.to_string().contains("courier relay"), "{err}");
}

/// Takes `cursor` for `owner`, waiting (10 s at most) while another holder lets go.
#[cfg(feature = "postgres")]
async fn take(cursor: &dyn CursorSource, owner: &str, lease: Duration) -> Box<dyn CursorLease> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(held) = cursor.acquire(owner, lease).await.unwrap() {
            return held;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cursor stayed held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads from `cursor` after `after` until it returns something (10 s at most: a transaction
/// of another test may hold the horizon back for a moment).
#[cfg(feature = "postgres")]
async fn read_some(
    cursor: &dyn CursorSource,
    after: CursorPosition,
) -> (Vec<Envelope>, CursorPosition) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (got, at) = cursor.read(after, 100).await.unwrap();
        if !got.is_empty() {
            return (got, at);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing to read after {after:?}"
        );
    }
}

/// The cursor never passes a row that commits late: a message committed by a transaction that
/// began after one still open waits until that one ends, then both come in the order of their
/// transactions; a rolled-back transaction's message never comes.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_cursor_never_passes_a_row_committed_late() {
    let h = common::postgres().await;
    let (t, _table) = h.make("&cursor=true").await;
    let pool = h.admin.postgres();
    let bus = MessageBus::builder()
        .transport("outbox", t.clone())
        .route("courier.test", ["outbox"])
        .message::<TestMessage>()
        .build();
    let mut early = pool.begin().await.unwrap();
    dispatch_in(&bus, &mut early, TestMessage::new(0))
        .await
        .unwrap();
    t.send(Envelope::new(TestMessage::new(1))).await.unwrap();
    let mut rolled = pool.begin().await.unwrap();
    dispatch_in(&bus, &mut rolled, TestMessage::new(9))
        .await
        .unwrap();
    rolled.rollback().await.unwrap();

    let cursor = t.as_cursor().unwrap();
    let start = CursorPosition::default();
    let (none, at) = cursor.read(start, 10).await.unwrap();
    assert!(
        none.is_empty(),
        "message 1 is committed, but waits behind the transaction still open before it"
    );
    assert_eq!(at, start);
    early.commit().await.unwrap();
    let (got, at) = read_some(cursor, start).await;
    assert_eq!(seqs(&got), [0, 1], "in the order of their transactions");
    let (none, after) = cursor.read(at, 10).await.unwrap();
    assert!(none.is_empty(), "nothing past the last: {:?}", seqs(&none));
    assert_eq!(after, at);
    let (again, _) = cursor.read(start, 10).await.unwrap();
    assert_eq!(seqs(&again), [0, 1], "reading moves nothing");
}

/// One holder at a time: a second waits while the first holds the cursor and takes it, where
/// it stands, once the first lets go (dropped: its session closes, as when its process dies).
/// Moving the cursor deletes the rows it passed; a holder that stays silent past its lease
/// loses it to the server, and its next move fails.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_cursor_has_one_holder_and_moves_for_good() {
    let h = common::postgres().await;
    let (t, table) = h.make("&cursor=true").await;
    t.send_batch(messages(0..5)).await.unwrap();
    let cursor = t.as_cursor().unwrap();
    let lease = Duration::from_secs(60);

    let mut one = cursor.acquire("one", lease).await.unwrap().expect("free");
    assert_eq!(one.position(), CursorPosition::default());
    assert!(
        cursor.acquire("two", lease).await.unwrap().is_none(),
        "held by one"
    );
    let (first, at) = read_some(cursor, one.position()).await;
    assert_eq!(seqs(&first), [0, 1, 2, 3, 4]);
    let (three, at3) = cursor.read(one.position(), 3).await.unwrap();
    assert_eq!(seqs(&three), [0, 1, 2]);
    assert!(at3 < at);
    one.advance(at3).await.unwrap();
    assert_eq!(h.admin.count(&table).await, 2, "the rows passed are gone");
    one.renew().await.unwrap();
    drop(one);

    let two = take(cursor, "two", lease).await;
    assert_eq!(two.position(), at3, "two goes on where one stopped");
    let (rest, _) = read_some(cursor, two.position()).await;
    assert_eq!(seqs(&rest), [3, 4]);
    drop(two);

    // Silent past its lease: the server ends the holder's session, and the cursor is free.
    let short = Duration::from_millis(500);
    let mut silent = take(cursor, "silent", short).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let three = cursor.acquire("three", lease).await.unwrap();
    assert!(
        three.is_some(),
        "a silent holder's cursor is free past its lease"
    );
    let lost = silent.advance(at).await.unwrap_err();
    assert!(lost.is_transient(), "{lost}");
    assert_eq!(h.admin.count(&table).await, 2, "a lost lease moves nothing");
    let mut three = three.expect("taken");
    assert_eq!(three.position(), at3);

    // A cursor moved by hand under its holder (an operator replaying from the start): the
    // holder's next move fails, transient (the relay takes the cursor again, where it now
    // stands), and deletes nothing.
    let pool = h.admin.postgres();
    sqlx::query(&format!("UPDATE {table}_cursors SET tx = 0, id = 0"))
        .execute(pool)
        .await
        .unwrap();
    let moved = three.advance(at).await.unwrap_err();
    assert!(moved.is_transient(), "{moved}");
    assert!(moved.to_string().contains("no longer at"), "{moved}");
    assert_eq!(h.admin.count(&table).await, 2, "nothing deleted");
    drop(three);
    let four = take(cursor, "four", lease).await;
    assert_eq!(four.position(), CursorPosition::default());
}

/// A cursor outbox hands the destination what is left of a delay; rows written before the
/// queue became a cursor outbox are adopted when a transport with `cursor=true` connects, and
/// rows written since without it once the relay's read finds nothing else.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_cursor_outbox_keeps_what_is_left_of_a_delay_and_adopts_rows_written_without_it() {
    let h = common::postgres().await;
    let (plain, table) = h.make("").await;
    plain.send_batch(messages(0..2)).await.unwrap();
    let t = h.reuse_with(&table, "&cursor=true").await;
    t.send(Envelope::new(TestMessage::new(2)).with(DelayStamp(Duration::from_secs(30))))
        .await
        .unwrap();
    t.send(Envelope::new(TestMessage::new(3)).with(DelayStamp(Duration::from_millis(1))))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cursor = t.as_cursor().unwrap();
    let (got, at) = read_some(cursor, CursorPosition::default()).await;
    assert_eq!(seqs(&got), [0, 1, 2, 3], "the older rows first");
    let left = got[2].last::<DelayStamp>().expect("a delay left").0;
    assert!(
        left > Duration::from_secs(25) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    assert!(
        got[3].last::<DelayStamp>().is_none(),
        "a served delay is gone"
    );
    assert!(got[0].last::<DelayStamp>().is_none());

    // A producer whose DSN lacks cursor=true keeps writing rows without a transaction id: the
    // relay's read adopts them once it finds nothing else for a poll window.
    plain.send_batch(messages(4..6)).await.unwrap();
    let (strays, _) = read_some(cursor, at).await;
    assert_eq!(
        seqs(&strays),
        [4, 5],
        "rows written without cursor=true come too"
    );
}

/// A cursor outbox restored from another cluster's dump into a fresh one: its rows and cursor
/// carry transaction ids this cluster has not reached. A relay connecting adopts the rows and
/// starts the cursor again, instead of waiting for as many transactions.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL: set COURIER_TEST_POSTGRES_URL"]
async fn a_cursor_outbox_restored_from_another_cluster_is_relayed() {
    let h = common::postgres().await;
    let (t, table) = h.make("&cursor=true").await;
    t.send_batch(messages(0..3)).await.unwrap();
    let pool = h.admin.postgres();
    for statement in [
        format!("UPDATE {table} SET relay_tx = relay_tx + 1000000000"),
        format!(
            "INSERT INTO {table}_cursors (queue_name, tx, id, owner, moved_at) \
             SELECT DISTINCT queue_name, 999999999, 0, 'old', 0 FROM {table}"
        ),
    ] {
        sqlx::query(&statement).execute(pool).await.unwrap();
    }
    let restored = h.reuse_with(&table, "&cursor=true").await;
    let cursor = restored.as_cursor().unwrap();
    let held = take(cursor, "new", Duration::from_secs(60)).await;
    assert_eq!(held.position(), CursorPosition::default(), "starts again");
    let (got, _) = read_some(cursor, held.position()).await;
    assert_eq!(seqs(&got), [0, 1, 2]);
}

/// `cursor=true` is PostgreSQL's: elsewhere the transport refuses to connect, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_outbox_needs_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = courier_core::Dsn::parse(&format!(
        "sqlite://{}?cursor=true",
        dir.path().join("c.db").display()
    ))
    .unwrap();
    let err = SqlTransport::connect("outbox", &dsn, courier_test::registry())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), courier_core::TransportErrorKind::Config);
    assert!(
        err.to_string().contains("cursor=true needs PostgreSQL"),
        "{err}"
    );
    assert_eq!(err.transport(), "outbox");
}
