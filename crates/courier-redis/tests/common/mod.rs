//! A conformance harness over the real Redis server (`COURIER_TEST_REDIS_URL`), with helpers.
//! Every transport gets a unique stream; its keys are deleted when the harness is dropped.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test file uses a different part"
)]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier_core::{Encoded, Transport, async_trait};
use courier_redis::{RedisOptions, RedisTransport};
use courier_test::{Harness, Poison};

/// The harness's redelivery window: long, so live deliveries never expire by themselves;
/// `expire_deliveries` rewrites idle times instead.
pub const REDELIVER: Duration = Duration::from_secs(3600);
/// How often the harness's transports look for stale deliveries.
pub const CLAIM_EVERY: Duration = Duration::from_millis(50);
/// The poll window of the harness's transports.
pub const POLL: Duration = Duration::from_millis(250);

pub struct RedisHarness {
    pub url: String,
    created: Mutex<Vec<Arc<RedisTransport>>>,
    /// Deletes every key of the streams (and non-default groups) of the transports made, when
    /// the harness goes, pass or fail (after the transports: fields drop in order).
    cleanup: courier_test::Cleanup,
}

impl RedisHarness {
    pub fn new() -> Self {
        Self {
            url: courier_test::env::redis_url(),
            created: Mutex::new(Vec::new()),
            cleanup: courier_test::Cleanup::new(),
        }
    }

    pub fn options(&self, stream: &str) -> RedisOptions {
        RedisOptions::default()
            .stream(stream)
            .redeliver_timeout(REDELIVER)
            .claim_interval(Some(CLAIM_EVERY))
            .poll_window(POLL)
    }

    /// A transport with these options, tracked for cleanup.
    pub async fn with_options(&self, options: RedisOptions) -> Arc<RedisTransport> {
        // `<stream>`, `<stream>:delayed`, `:paused`, `:limit`, `:dedup:*`; `<group>:workers`,
        // `<group>:schedule:*` (the default group `courier` is not a test's own).
        self.cleanup.redis_keys(&self.url, &options.stream);
        if options.group != "courier" && options.group != options.stream {
            self.cleanup.redis_keys(&self.url, &options.group);
        }
        let transport = tokio::time::timeout(
            Duration::from_secs(10),
            RedisTransport::connect(&self.url, options, courier_test::registry()),
        )
        .await
        .expect("connecting to redis timed out")
        .expect("cannot connect to redis");
        let transport = Arc::new(transport);
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(transport.clone());
        transport
    }

    pub fn concrete(&self, transport: &Arc<dyn Transport>) -> Arc<RedisTransport> {
        let wanted = Arc::as_ptr(transport).cast::<()>();
        let created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        let found = created
            .iter()
            .find(|c| Arc::as_ptr(c).cast::<()>() == wanted);
        Arc::clone(found.expect("the transport was not created by this harness"))
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.url.as_str()).expect("bad COURIER_TEST_REDIS_URL");
        tokio::time::timeout(
            Duration::from_secs(10),
            client.get_multiplexed_async_connection(),
        )
        .await
        .expect("connecting to redis timed out")
        .expect("cannot connect to redis")
    }

    /// Makes every pending entry of the stream look idle for longer than the redelivery
    /// window (`XCLAIM ... IDLE ... JUSTID` to its current owner: no new delivery is counted).
    pub async fn make_idle(&self, t: &RedisTransport) {
        let mut conn = self.conn().await;
        let o = t.options();
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&o.stream)
            .arg(&o.group)
            .arg("-")
            .arg("+")
            .arg(100_000)
            .query_async(&mut conn)
            .await
            .expect("XPENDING");
        let idle = u64::try_from(o.redeliver_timeout.as_millis()).unwrap_or(u64::MAX / 2) + 1000;
        for (id, consumer, _, _) in pending {
            let _: redis::Value = redis::cmd("XCLAIM")
                .arg(&o.stream)
                .arg(&o.group)
                .arg(&consumer)
                .arg(0)
                .arg(&id)
                .arg("IDLE")
                .arg(idle)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await
                .expect("XCLAIM IDLE");
        }
        // Let the next get's claim interval come round.
        tokio::time::sleep(CLAIM_EVERY + Duration::from_millis(10)).await;
    }

    /// Kills every connection named after the transport's consumer.
    pub async fn kill_connections(&self, consumer: &str) -> usize {
        let mut conn = self.conn().await;
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .expect("CLIENT LIST");
        let ids: Vec<String> = list
            .lines()
            .filter(|line| line.split(' ').any(|f| f == format!("name={consumer}")))
            .filter_map(|line| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix("id="))
                    .map(str::to_owned)
            })
            .collect();
        for id in &ids {
            let _: redis::Value = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query_async(&mut conn)
                .await
                .expect("CLIENT KILL");
        }
        ids.len()
    }
}

#[async_trait]
impl Harness for RedisHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        let stream = courier_test::env::unique_name("courier_test");
        let transport = self.with_options(self.options(&stream)).await;
        let setup = transport
            .abilities()
            .setup
            .expect("redis transport has setup");
        tokio::time::timeout(Duration::from_secs(10), setup.setup())
            .await
            .expect("setup timed out")
            .expect("setup");
        transport
    }

    async fn transport_with_redelivery(&self, window: Duration) -> Option<Arc<dyn Transport>> {
        let stream = courier_test::env::unique_name("courier_test");
        let transport = self
            .with_options(self.options(&stream).redeliver_timeout(window))
            .await;
        let setup = transport
            .abilities()
            .setup
            .expect("redis transport has setup");
        tokio::time::timeout(Duration::from_secs(10), setup.setup())
            .await
            .expect("setup timed out")
            .expect("setup");
        Some(transport)
    }

    async fn expire_deliveries(&self, transport: &Arc<dyn Transport>) {
        self.make_idle(&self.concrete(transport)).await;
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        let t = self.concrete(transport);
        let mut conn = self.conn().await;
        let _: String = redis::cmd("XADD")
            .arg(&t.options().stream)
            .arg("*")
            .arg("body")
            .arg(&encoded.body)
            .arg("headers")
            .arg(encoded.headers_json())
            .query_async(&mut conn)
            .await
            .expect("XADD");
    }

    async fn store_poison(&self, transport: &Arc<dyn Transport>, poison: Poison) -> bool {
        let t = self.concrete(transport);
        let good_body: &[u8] = br#"{"seq":2,"text":"x"}"#;
        let headers = courier_test::POISON_HEADERS.as_bytes();
        // Field name and value pairs of the entry, as bytes.
        let fields: Vec<(&str, &[u8])> = match poison {
            Poison::BinaryBody => vec![("body", courier_test::POISON_BODY), ("headers", headers)],
            Poison::MissingBody => vec![("headers", headers)],
            Poison::BinaryHeaders => vec![("body", good_body), ("headers", b"{\"\xff\"")],
            Poison::HeadersNotJson => vec![("body", good_body), ("headers", b"not json")],
            Poison::MissingHeaders => vec![("body", good_body)],
            // Every field value is a string of bytes.
            _ => return false,
        };
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&t.options().stream).arg("*");
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        let mut conn = self.conn().await;
        let _: String = cmd.query_async(&mut conn).await.expect("XADD");
        true
    }

    async fn break_connection(&self, transport: &Arc<dyn Transport>) -> bool {
        let t = self.concrete(transport);
        let killed = self.kill_connections(t.consumer()).await;
        assert!(killed > 0, "no connection named {} to kill", t.consumer());
        true
    }

    fn poll_window(&self) -> Duration {
        POLL
    }

    fn supports_priority(&self) -> bool {
        false
    }
}

pub async fn harness() -> RedisHarness {
    RedisHarness::new()
}
