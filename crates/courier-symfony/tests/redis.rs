//! Courier and real Symfony Messenger 5.4 (PHP, Debian's packages, phpredis) on one Redis stream
//! and consumer group: each side consumes what the other sends (delayed messages included,
//! moved to the stream by either side), a retry crosses sides with its count, both consume one
//! stream together with none lost or doubled, a message Courier holds is not claimed by PHP,
//! and a message Courier cannot read lands in its failure transport. With phpredis's PHP
//! serializer (the default) and without (`serializer=0`).
//!
//! Run with `--include-ignored` after `scripts/services` (PHP, Redis).

#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::scenarios::{
    PHP_LIMIT, courier_drains_php_1000, courier_fails_php_retries_again,
    courier_moves_unreadable_to, courier_sends, failure_reasons, php_and_courier_share_1000,
    php_consumes_courier_1000, php_dispatches_unreadable, php_fails_20_once,
    php_reads_courier_retries, retry_strategy, timeout,
};
use common::{SendEmail, consumed, php};
use courier_core::{
    CancellationToken, Dsn, FactoryContext, HandlerError, MessageBus, Transport, TransportRegistry,
    Worker,
};
use courier_symfony::{PHP_DECODE_ERROR_HEADER, SymfonyTransportFactory};
use redis::aio::MultiplexedConnection;

const IGNORE: &str = "";

/// One stream of a test (unique name; it and its `__queue` deleted when the test ends).
struct Stream {
    name: String,
    host_port: String,
    conn: MultiplexedConnection,
    _cleanup: courier_test::Cleanup,
}

impl Stream {
    async fn new() -> Self {
        let cleanup = courier_test::Cleanup::new();
        let name = cleanup.redis_name("symredis");
        let url = courier_test::env::redis_url();
        let host_port = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("Redis at COURIER_TEST_REDIS_URL");
        Self {
            name,
            host_port,
            conn,
            _cleanup: cleanup,
        }
    }

    /// The DSN's options both sides use: acked entries deleted (so that an empty stream means
    /// all handled), then `extra`.
    fn query(serializer: u8, extra: &str) -> String {
        format!("serializer={serializer}&delete_after_ack=true{extra}")
    }

    /// PHP's DSN for consumer `consumer`.
    fn php(&self, consumer: &str, serializer: u8, extra: &str) -> String {
        format!(
            "redis://{}/{}/symfony/{consumer}?{}",
            self.host_port,
            self.name,
            Self::query(serializer, extra)
        )
    }

    /// Courier's transport for consumer `consumer`, from a `symfony+redis://` DSN.
    async fn courier(&self, consumer: &str, serializer: u8, extra: &str) -> Arc<dyn Transport> {
        self.courier_on(&self.name, consumer, serializer, extra)
            .await
    }

    async fn courier_on(
        &self,
        stream: &str,
        consumer: &str,
        serializer: u8,
        extra: &str,
    ) -> Arc<dyn Transport> {
        let dsn = format!(
            "symfony+redis://{}/{stream}/symfony/{consumer}?{}",
            self.host_port,
            Self::query(serializer, extra)
        );
        let factories = TransportRegistry::new().with(Arc::new(SymfonyTransportFactory::new(
            common::serializer().types().clone(),
        )));
        let ctx =
            FactoryContext::new(consumer, Dsn::parse(&dsn).unwrap()).registry(common::registry());
        timeout(factories.create(ctx)).await.expect("connects")
    }

    async fn int(&mut self, cmd: &str, key: &str) -> i64 {
        redis::cmd(cmd)
            .arg(key)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// Entries in the stream.
    async fn len(&mut self) -> i64 {
        let key = self.name.clone();
        self.int("XLEN", &key).await
    }

    /// Members of `<stream>__queue`.
    async fn delayed(&mut self) -> i64 {
        let key = format!("{}__queue", self.name);
        self.int("ZCARD", &key).await
    }

    /// The `message` fields of the stream's entries.
    async fn fields(&mut self) -> Vec<String> {
        let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(&self.name)
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        entries
            .into_iter()
            .map(|(_, fields)| {
                let (name, value) = fields.into_iter().next().unwrap();
                assert_eq!(name, "message");
                value
            })
            .collect()
    }
}

async fn php_dispatches_1000_and_courier_consumes_them_all(serializer: u8) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    php(
        "dispatch.php",
        &[&s.php("php", serializer, IGNORE), "1", "1000", "10"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert_eq!(
        s.delayed().await,
        100,
        "every 10th message is delayed by PHP"
    );
    let fields = s.fields().await;
    assert_eq!(fields.len(), 900);
    assert!(
        fields
            .iter()
            .all(|f| f.starts_with(if serializer == 1 { "s:" } else { "{" })),
        "PHP wrote with serializer={serializer}: {}",
        fields[0]
    );
    courier_drains_php_1000(&*t).await;
    assert_eq!((s.len().await, s.delayed().await), (0, 0), "all acked");
}

async fn courier_dispatches_1000_and_php_consumes_them_all(serializer: u8) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    courier_sends(&*t, 1, 1000, "+00:00").await;
    assert_eq!(s.delayed().await, 100, "every 10th message is delayed");
    let fields = s.fields().await;
    assert_eq!(fields.len(), 900);
    for field in &fields {
        assert!(
            field.starts_with(if serializer == 1 { "s:" } else { "{\"body\":" }),
            "written with serializer={serializer}: {field}"
        );
        assert!(
            field.contains("x-courier-stamp-priority") && !field.contains("PriorityStamp"),
            "Courier's own stamps are plain headers: {field}"
        );
    }
    php_consumes_courier_1000(&s.php("php", serializer, IGNORE), "UTC", "+00:00").await;
    assert_eq!((s.len().await, s.delayed().await), (0, 0), "all acked");
}

async fn a_retry_crosses_from_php_to_courier_and_back_with_its_count(serializer: u8) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    let php_dsn = s.php("php", serializer, IGNORE);
    // PHP fails each once: Symfony's retry listener sends it again with RedeliveryStamp 1, a
    // second later (in `__queue`).
    php_fails_20_once(&php_dsn).await;
    assert_eq!(s.delayed().await, 20, "PHP's retries wait in __queue");

    // Courier moves them when due and fails each again: its worker retries it with
    // RedeliveryStamp 2, into `__queue` too.
    courier_fails_php_retries_again(t.clone(), "default", retry_strategy()).await;
    assert_eq!(s.delayed().await, 20, "Courier's retries wait in __queue");

    // PHP moves Courier's retries when due.
    php_reads_courier_retries(&php_dsn, 2).await;
    assert_eq!((s.len().await, s.delayed().await), (0, 0), "all handled");
}

async fn php_and_courier_workers_share_one_stream_with_none_lost_or_doubled(serializer: u8) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    let dsn = s.php("php", serializer, IGNORE);
    php_and_courier_share_1000(&*t, dsn, "10", async |_, _| {
        s.len().await == 0 && s.delayed().await == 0
    })
    .await;
}

/// PHP claims what another consumer left pending past `redeliver_timeout` (a second here);
/// Courier's keepalive keeps what it works on from going idle that long.
async fn a_message_courier_keeps_alive_is_not_claimed_by_php(serializer: u8) {
    let mut s = Stream::new().await;
    let fast = "&redeliver_timeout=1&claim_interval=200";
    let t = s.courier("rust", serializer, fast).await;
    courier_sends(&*t, 1, 1, "+00:00").await;
    let held = timeout(t.get(1)).await.unwrap();
    assert_eq!(held.len(), 1);
    let php_dsn = s.php("php", serializer, fast);
    let keeper = {
        let t = t.clone();
        let held = held.clone();
        tokio::spawn(async move {
            loop {
                t.keepalive_batch(&held).await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let out = php("consume.php", &[&php_dsn, "1", "3"], "UTC", PHP_LIMIT).await;
    keeper.abort();
    assert!(consumed(&out).is_empty(), "PHP left it to Courier: {out}");

    // Without keepalives PHP claims it once it is idle a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = php("consume.php", &[&php_dsn, "1", "5"], "UTC", PHP_LIMIT).await;
    let lines = consumed(&out);
    assert_eq!(lines.len(), 1, "PHP claimed the idle entry: {out}");
    assert_eq!(lines[0].id, Some(1));
    assert_eq!(s.len().await, 0);
}

async fn a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason(
    serializer: u8,
) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    let failed_stream = format!("{}_failed", s.name);
    let failed = s
        .courier_on(&failed_stream, "rust", serializer, IGNORE)
        .await;
    let php_dsn = s.php("php", serializer, IGNORE);
    php_dispatches_unreadable(&php_dsn).await;
    // And a field that is no Symfony message at all.
    let _: String = redis::cmd("XADD")
        .arg(&s.name)
        .arg("*")
        .arg("message")
        .arg("not json")
        .query_async(&mut s.conn)
        .await
        .unwrap();
    courier_moves_unreadable_to(t.clone(), "default", failed.clone(), 3).await;
    let pending: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(&s.name)
        .arg("symfony")
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(&mut s.conn)
        .await
        .unwrap();
    assert!(pending.is_empty(), "none left to loop: {pending:?}");
    assert_eq!(s.len().await, 0, "rejected entries are deleted");

    let (moved, reasons) = failure_reasons(&*failed, 3).await;
    let unmapped = reasons
        .iter()
        .find(|(class, _)| class == r"App\Message\Unmapped")
        .unwrap_or_else(|| panic!("{reasons:?}"));
    assert!(unmapped.1.contains(r"App\Message\Unmapped"), "{reasons:?}");
    let misfit = reasons
        .iter()
        .find(|(class, _)| class == "mail.misfit")
        .unwrap_or_else(|| panic!("{reasons:?}"));
    assert!(misfit.1.contains("invalid JSON body"), "{reasons:?}");
    let unreadable = moved
        .iter()
        .find(|e| e.message_name() != r"App\Message\Unmapped" && e.message_name() != "mail.misfit")
        .expect("the unreadable field");
    let why = unreadable
        .extra_headers()
        .and_then(|h| h.get(PHP_DECODE_ERROR_HEADER))
        .unwrap_or_else(|| panic!("{unreadable:?}"));
    assert!(
        why.contains("not Symfony's JSON object"),
        "the unreadable field says why: {why}"
    );
    let _: i64 = redis::cmd("DEL")
        .arg(&failed_stream)
        .arg(format!("{failed_stream}__queue"))
        .query_async(&mut s.conn)
        .await
        .unwrap();
}

/// Courier moves a member PHP wrote in `<stream>__queue` (the golden vector) to the stream
/// byte for byte as PHP's `get()` does (`tests/symfony/golden.php` captured both).
async fn courier_moves_a_php_delayed_member_byte_for_byte_as_php_does(serializer: u8) {
    let mut s = Stream::new().await;
    let t = s.courier("rust", serializer, IGNORE).await;
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/symfony/golden");
    let member = std::fs::read_to_string(dir.join("redis_queue_member.member")).unwrap();
    let moved = std::fs::read_to_string(dir.join("redis_queue_moved.field")).unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg(format!("{}__queue", s.name))
        .arg("NX")
        .arg(1)
        .arg(&member)
        .query_async(&mut s.conn)
        .await
        .unwrap();
    let got = timeout(t.get(10)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].message::<SendEmail>().is_some(),
        "{:?}",
        got[0].decode_error()
    );
    assert_eq!(s.fields().await, vec![moved]);
    timeout(t.ack(&got[0])).await.unwrap();
    assert_eq!((s.len().await, s.delayed().await), (0, 0));
}

/// A Courier worker whose handler runs past PHP's `redeliver_timeout` (3 s here) keeps its
/// message alive (a keepalive every third of it): a PHP worker on the same group meanwhile
/// claims nothing, and the message is handled once.
async fn a_long_courier_handler_is_not_redelivered_to_php(serializer: u8) {
    let mut s = Stream::new().await;
    let fast = "&redeliver_timeout=3&claim_interval=200";
    let t = s.courier("rust", serializer, fast).await;
    courier_sends(&*t, 1, 1, "+00:00").await;
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&handled);
    let bus = MessageBus::builder()
        .handler_fn("slow", move |m: Arc<SendEmail>| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(m.id);
                tokio::time::sleep(Duration::from_secs(8)).await;
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let worker = tokio::spawn(
        Worker::builder(bus)
            .receiver("default", t.clone())
            .limit(1)
            .build()
            .run(CancellationToken::new()),
    );
    // PHP starts once Courier holds the message, and looks for 6 s: twice the timeout.
    let start = Instant::now();
    while handled.lock().unwrap().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "Courier got it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = php(
        "consume.php",
        &[&s.php("php", serializer, fast), "1", "6"],
        "UTC",
        PHP_LIMIT,
    )
    .await;
    assert!(consumed(&out).is_empty(), "PHP claimed nothing: {out}");
    let stats = tokio::time::timeout(Duration::from_secs(30), worker)
        .await
        .expect("worker in time")
        .unwrap()
        .unwrap();
    assert_eq!(stats.handled, 1, "{stats:?}");
    assert_eq!(*handled.lock().unwrap(), vec![1]);
    assert_eq!(s.len().await, 0, "acked");
}

/// `auto_setup=false` creates nothing, and `check` names the missing group.
async fn without_auto_setup_a_missing_group_is_named() {
    let mut s = Stream::new().await;
    let t = s.courier("rust", 1, "&auto_setup=false").await;
    let setup = t.as_setup().expect("Setup");
    let err = setup.check().await.expect_err("no group yet");
    let text = courier_core::error_chain(&err).to_string();
    assert!(
        text.contains("`symfony`") && text.contains(&s.name),
        "{text}"
    );
    assert_eq!(s.len().await, 0, "nothing created");
    setup.setup().await.unwrap();
    setup.check().await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&s.name)
        .query_async(&mut s.conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs php and redis: run scripts/services, set COURIER_TEST_REDIS_URL"]
async fn without_auto_setup_nothing_is_created_and_check_names_the_group() {
    without_auto_setup_a_missing_group_is_named().await;
}

/// No server needed: a `symfony+redis://` DSN's bad option is named, and its password shows
/// neither in the connection error nor in `Debug`.
#[tokio::test]
async fn the_dsn_names_bad_options_and_hides_the_password() {
    let factories = TransportRegistry::new().with(Arc::new(SymfonyTransportFactory::default()));
    let create = |dsn: &str| {
        let ctx =
            FactoryContext::new("async", Dsn::parse(dsn).unwrap()).registry(common::registry());
        let factories = factories.clone();
        async move { timeout(factories.create(ctx)).await }
    };
    let err = create("symfony+redis://app:s3cret@127.0.0.1:6379/s?queue_name=x")
        .await
        .expect_err("unknown option");
    let text = courier_core::error_chain(&err).to_string();
    assert!(text.contains("`queue_name`"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    // Nothing listens on port 1.
    let err = create("symfony+redis://app:s3cret@127.0.0.1:1/s/g/c")
        .await
        .expect_err("no server");
    let text = format!("{} {err:?}", courier_core::error_chain(&err));
    assert!(!text.contains("s3cret"), "{text}");
    assert!(
        text.contains("127.0.0.1:1") || text.contains("connect"),
        "{text}"
    );
}

macro_rules! tests {
    ($($name:ident => $fun:ident($serializer:expr);)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs php and redis: run scripts/services, set COURIER_TEST_REDIS_URL"]
            async fn $name() {
                $fun($serializer).await;
            }
        )*
    };
}

tests! {
    php_dispatches_1000_and_courier_consumes_them_all_php_serializer =>
        php_dispatches_1000_and_courier_consumes_them_all(1);
    php_dispatches_1000_and_courier_consumes_them_all_no_serializer =>
        php_dispatches_1000_and_courier_consumes_them_all(0);
    courier_dispatches_1000_and_php_consumes_them_all_php_serializer =>
        courier_dispatches_1000_and_php_consumes_them_all(1);
    courier_dispatches_1000_and_php_consumes_them_all_no_serializer =>
        courier_dispatches_1000_and_php_consumes_them_all(0);
    a_retry_crosses_sides_with_its_count_php_serializer =>
        a_retry_crosses_from_php_to_courier_and_back_with_its_count(1);
    a_retry_crosses_sides_with_its_count_no_serializer =>
        a_retry_crosses_from_php_to_courier_and_back_with_its_count(0);
    php_and_courier_workers_share_one_stream_php_serializer =>
        php_and_courier_workers_share_one_stream_with_none_lost_or_doubled(1);
    a_message_courier_keeps_alive_is_not_claimed_by_php_no_serializer =>
        a_message_courier_keeps_alive_is_not_claimed_by_php(0);
    courier_moves_a_php_delayed_member_as_php_does_php_serializer =>
        courier_moves_a_php_delayed_member_byte_for_byte_as_php_does(1);
    a_long_courier_handler_is_not_redelivered_to_php_php_serializer =>
        a_long_courier_handler_is_not_redelivered_to_php(1);
    unreadable_messages_land_in_the_failure_transport_php_serializer =>
        a_message_courier_cannot_read_lands_in_the_failure_transport_with_class_and_reason(1);
}
