//! The NATS test harness: a transport per test on its own stream (deleted when the harness
//! drops), connected through a local TCP proxy the harness can cut to break its connections,
//! raw publishing, and releasing deliveries as a consumer that dies.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "each test file uses a different part"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Dsn, Encoded, Transport, async_trait};
use courier_nats::{NatsOptions, NatsTransport};
use courier_test::{Harness, Poison};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub const OP: Duration = Duration::from_secs(15);

/// A TCP proxy in front of the server: `cut` closes every connection through it (the
/// listener stays, so the client reconnects).
pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (cut, _) = watch::channel(0u64);
        let cuts = cut.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { port, cut, accept }
    }

    /// Closes every connection through the proxy.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

pub struct NatsHarness {
    pub url: Dsn,
    pub proxy: Proxy,
    made: Mutex<Vec<Arc<NatsTransport>>>,
}

pub async fn harness() -> NatsHarness {
    NatsHarness::new().await
}

fn address(url: &Dsn) -> String {
    format!(
        "{}:{}",
        url.host().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(4222)
    )
}

impl NatsHarness {
    pub async fn new() -> Self {
        let url = Dsn::parse(&courier_test::env::nats_url()).expect("COURIER_TEST_NATS_URL parses");
        let proxy = Proxy::start(address(&url)).await;
        Self {
            url,
            proxy,
            made: Mutex::new(Vec::new()),
        }
    }

    /// A unique stream name.
    pub fn unique(prefix: &str) -> String {
        courier_test::env::unique_name(prefix)
    }

    /// The DSN of the server through the proxy, credentials kept.
    pub fn proxied_dsn(&self) -> Dsn {
        let auth = match (self.url.user(), self.url.password()) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            _ => String::new(),
        };
        Dsn::parse(&format!("nats://{auth}127.0.0.1:{}", self.proxy.port)).expect("dsn")
    }

    /// Options for a fresh transport: a long ack wait (deliveries expire only when a test says
    /// so) and a short poll window.
    pub fn options(stream: &str) -> NatsOptions {
        NatsOptions::new(stream)
            .ack_wait(Duration::from_secs(60))
            .poll_window(Duration::from_millis(500))
    }

    /// A set-up transport with these options, its stream deleted when the harness drops.
    pub async fn make(&self, options: NatsOptions) -> Arc<NatsTransport> {
        let name = options.stream_name().to_owned();
        let t = Arc::new(
            NatsTransport::new(name, &self.proxied_dsn(), options, courier_test::registry())
                .expect("transport"),
        );
        self.made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Arc::clone(&t));
        let setup = t.abilities().setup.expect("nats has setup");
        tokio::time::timeout(OP, setup.setup())
            .await
            .expect("setup timed out")
            .expect("setup");
        t
    }

    fn find(&self, t: &Arc<dyn Transport>) -> Arc<NatsTransport> {
        let made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        made.iter()
            .find(|m| std::ptr::addr_eq(Arc::as_ptr(m), Arc::as_ptr(t)))
            .cloned()
            .expect("a transport made by this harness")
    }

    /// A raw client straight to the server (not through the proxy).
    pub async fn raw_client(&self) -> async_nats::Client {
        let mut options = async_nats::ConnectOptions::new();
        if let (Some(u), Some(p)) = (self.url.user(), self.url.password()) {
            options = options.user_and_password(u.to_owned(), p.to_owned());
        }
        tokio::time::timeout(OP, options.connect(address(&self.url)))
            .await
            .expect("raw connect timed out")
            .expect("raw connect")
    }

    /// Publishes a payload of any bytes with these headers to `subject`, as a producer in
    /// another language would, and waits for the PubAck.
    pub async fn publish_bytes(
        &self,
        subject: &str,
        body: &[u8],
        headers: std::collections::BTreeMap<String, String>,
    ) {
        let client = self.raw_client().await;
        let js = async_nats::jetstream::new(client);
        let mut map = async_nats::HeaderMap::new();
        for (k, v) in headers {
            map.insert(k.as_str(), v.as_str());
        }
        let ack = js
            .publish_with_headers(subject.to_owned(), map, body.to_vec().into())
            .await
            .expect("raw publish");
        tokio::time::timeout(OP, ack.into_future())
            .await
            .expect("raw PubAck timed out")
            .expect("raw PubAck");
    }
}

impl Drop for NatsHarness {
    fn drop(&mut self) {
        let made: Vec<_> = std::mem::take(
            &mut *self
                .made
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if made.is_empty() {
            return;
        }
        let cleanup = async move {
            for t in made {
                // A loaded server can miss the JetStream API's request timeout while it deletes
                // a big stream: try again on a fresh connection, and say so if it stays.
                let mut failure = None;
                for _ in 0..3 {
                    match tokio::time::timeout(OP, t.delete_stream()).await {
                        Ok(Ok(())) => {
                            failure = None;
                            break;
                        }
                        Ok(Err(e)) => {
                            let e = courier_core::error_chain(&e).to_string();
                            // Gone already (an earlier attempt's answer was lost).
                            if e.contains("not found") {
                                failure = None;
                                break;
                            }
                            failure = Some(e);
                        }
                        Err(_) => failure = Some(format!("no answer within {OP:?}")),
                    }
                    t.close().await;
                }
                if let Some(e) = failure {
                    eprintln!("test teardown: cannot delete a test stream: {e}");
                }
                t.close().await;
            }
        };
        courier_test::block_on_teardown(cleanup);
    }
}

#[async_trait]
impl Harness for NatsHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        self.make(Self::options(&Self::unique("courier_nats")))
            .await
    }

    async fn transport_with_redelivery(&self, window: Duration) -> Option<Arc<dyn Transport>> {
        let options = Self::options(&Self::unique("courier_nats")).ack_wait(window);
        Some(self.make(options).await)
    }

    async fn expire_deliveries(&self, transport: &Arc<dyn Transport>) {
        let t = self.find(transport);
        tokio::time::timeout(OP, t.release_deliveries())
            .await
            .expect("release timed out")
            .expect("release deliveries");
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        let t = self.find(transport);
        let subject = t.options().subject_name().to_owned();
        self.publish_bytes(&subject, encoded.body.as_bytes(), encoded.headers)
            .await;
    }

    async fn store_poison(&self, transport: &Arc<dyn Transport>, poison: Poison) -> bool {
        let t = self.find(transport);
        let subject = t.options().subject_name().to_owned();
        let typed: std::collections::BTreeMap<String, String> = [
            ("type".to_owned(), "courier.test".to_owned()),
            ("content-type".to_owned(), "application/json".to_owned()),
        ]
        .into();
        let (body, headers): (&[u8], _) = match poison {
            Poison::BinaryBody => (courier_test::POISON_BODY, typed),
            Poison::MissingBody => (b"", typed),
            Poison::MissingHeaders => (br#"{"seq":2,"text":"x"}"#, Default::default()),
            // Headers are NATS header lines, never one JSON text, and async-nats neither
            // writes nor reads header bytes that are not UTF-8; a body has no other type.
            _ => return false,
        };
        self.publish_bytes(&subject, body, headers).await;
        true
    }

    async fn break_connection(&self, _transport: &Arc<dyn Transport>) -> bool {
        self.proxy.cut();
        true
    }

    fn poll_window(&self) -> Duration {
        Duration::from_millis(500)
    }
}
