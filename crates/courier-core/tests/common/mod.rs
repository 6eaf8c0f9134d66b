//! What the worker tests share: a job message and an in-memory queue holding some.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use courier_core::{
    Capabilities, Envelope, InMemoryTransport, Message, Transport, TransportError, async_trait,
};
use serde::{Deserialize, Serialize};

/// A job carrying its number.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Job(pub u32);
impl Message for Job {
    const NAME: &'static str = "test.job";
}

/// An in-memory queue holding jobs `0..n`.
pub async fn queue_with(n: u32) -> Arc<InMemoryTransport> {
    let q = Arc::new(InMemoryTransport::new());
    for i in 0..n {
        q.send(Envelope::new(Job(i)))
            .await
            .expect("the in-memory queue takes every job");
    }
    q
}

/// An in-memory transport counting its `ack_batch` calls; `bounded` makes it say its server
/// bounds unacked deliveries, as AMQP's prefetch does; `with_get` that it acks and gets in one
/// round trip (as SQL does), counting those too, failing the first `fail_ack_gets` of them.
#[derive(Debug)]
pub struct CountAcks {
    pub inner: Arc<InMemoryTransport>,
    pub acks: AtomicUsize,
    pub bounded: bool,
    /// The server's window of unacked deliveries, when it says so (AMQP's prefetch).
    pub window: Option<usize>,
    pub with_get: bool,
    /// `ack_and_get` calls that carried acks.
    pub ack_gets: AtomicUsize,
    /// Acks that went in them.
    pub carried: AtomicUsize,
    pub fail_ack_gets: AtomicUsize,
    /// How long each `get` takes (a round trip to the server).
    pub get_takes: Duration,
}

impl CountAcks {
    pub fn new(inner: Arc<InMemoryTransport>, bounded: bool) -> Arc<Self> {
        Arc::new(Self {
            inner,
            acks: AtomicUsize::new(0),
            bounded,
            window: None,
            with_get: false,
            ack_gets: AtomicUsize::new(0),
            carried: AtomicUsize::new(0),
            fail_ack_gets: AtomicUsize::new(0),
            get_takes: Duration::ZERO,
        })
    }

    /// A transport whose every `get` takes `takes`, as a server's round trip does.
    pub fn slow_gets(inner: Arc<InMemoryTransport>, takes: Duration) -> Arc<Self> {
        let mut t = Self::new(inner, false);
        if let Some(t) = Arc::get_mut(&mut t) {
            t.get_takes = takes;
        }
        t
    }

    /// A transport that acks in its gets, failing the first `failures` that carry acks.
    /// Bounded like AMQP's prefetch, saying its window.
    pub fn windowed(inner: Arc<InMemoryTransport>, window: usize) -> Arc<Self> {
        let mut t = Self::new(inner, true);
        if let Some(t) = Arc::get_mut(&mut t) {
            t.window = Some(window);
        }
        t
    }

    pub fn acking_with_get(inner: Arc<InMemoryTransport>, failures: usize) -> Arc<Self> {
        Arc::new(Self {
            inner,
            acks: AtomicUsize::new(0),
            bounded: false,
            window: None,
            with_get: true,
            ack_gets: AtomicUsize::new(0),
            carried: AtomicUsize::new(0),
            fail_ack_gets: AtomicUsize::new(failures),
            get_takes: Duration::ZERO,
        })
    }

    /// `ack_batch` calls so far.
    pub fn ack_batches(&self) -> usize {
        self.acks.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Transport for CountAcks {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        // Under a window, deliveries come in small bursts (two at a time), as a broker's do
        // when small acks free small parts of its window.
        let max = if self.window.is_some() {
            max.min(2)
        } else {
            max
        };
        if !self.get_takes.is_zero() {
            tokio::time::sleep(self.get_takes).await;
        }
        self.inner.get(max).await
    }
    async fn ack(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.ack(e).await
    }
    async fn reject(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(e).await
    }
    async fn ack_batch(&self, es: &[Envelope]) -> Result<(), TransportError> {
        self.acks.fetch_add(1, Ordering::SeqCst);
        self.inner.ack_batch(es).await
    }
    async fn ack_and_get(
        &self,
        es: &[Envelope],
        max: usize,
    ) -> Result<Vec<Envelope>, TransportError> {
        if !es.is_empty() {
            let failing = self
                .fail_ack_gets
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Err(TransportError::new(
                    courier_core::TransportErrorKind::Connection,
                    "counted",
                ));
            }
            self.ack_gets.fetch_add(1, Ordering::SeqCst);
            self.carried.fetch_add(es.len(), Ordering::SeqCst);
            self.inner.ack_batch(es).await?;
        }
        self.inner.get(max).await
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if self.bounded {
            caps = caps.with_bounded_unacked();
        }
        if let Some(window) = self.window {
            caps = caps.with_unacked_window(window);
        }
        if self.with_get {
            caps = caps.with_ack_with_get();
        }
        caps
    }
}

/// The first call counted by `calls` never returns (a server that stopped answering on that
/// connection); later ones go on.
pub async fn silent_once(calls: &AtomicUsize) {
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
}

/// A source (or a destination) whose server stops answering (a network partition, a
/// connection black-holed by a failover): its first drain, commit, fetch, ack and batch send
/// never return. Later ones take from, and ack on, an in-memory queue; it is read with `get`
/// and `ack_batch` (courier-sql's tests/relay_drain.rs has the draining twin).
#[derive(Debug, Default)]
pub struct Unanswering {
    pub inner: Arc<InMemoryTransport>,
    pub get_calls: AtomicUsize,
    pub ack_calls: AtomicUsize,
    /// `send_batch` calls (as a destination: the first never answers either).
    pub send_calls: AtomicUsize,
}

#[async_trait]
impl Transport for Unanswering {
    async fn send(&self, e: Envelope) -> Result<Envelope, TransportError> {
        self.inner.send(e).await
    }
    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        silent_once(&self.get_calls).await;
        self.inner.get(max).await
    }
    async fn ack(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.ack(e).await
    }
    async fn ack_batch(&self, es: &[Envelope]) -> Result<(), TransportError> {
        silent_once(&self.ack_calls).await;
        self.inner.ack_batch(es).await
    }
    async fn keepalive(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.keepalive(e).await
    }
    async fn send_batch(&self, es: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        silent_once(&self.send_calls).await;
        self.inner.send_batch(es).await
    }
    async fn reject(&self, e: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(e).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// Runs `work` on the paused clock; panics with `stalled` if it still waits after ten minutes.
/// Returns its output and how long it took.
pub async fn within_ten_minutes<T>(
    stalled: &str,
    work: impl std::future::Future<Output = T>,
) -> (T, Duration) {
    let started = tokio::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(600), work)
        .await
        .unwrap_or_else(|_| panic!("{stalled}"));
    (out, started.elapsed())
}
