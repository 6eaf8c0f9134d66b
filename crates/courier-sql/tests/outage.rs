//! A database that goes away under a running transport (every connection cut, new ones
//! refused): the next claim fails within the pool's `acquire_timeout`, naming the cause, instead
//! of waiting the timeout out again and again. A path to the database that goes silent (every
//! open connection black-holed, new ones fine: a failover, a NAT that dropped its state): once
//! a statement on it is given up, the next one runs on a new connection instead of on another
//! silent one from the pool. The server is reached through a TCP forwarder on 127.0.0.1 that
//! the test shuts down or freezes.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Dsn, Envelope, Transport, TransportErrorKind};
use courier_sql::SqlTransport;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards connections from a local port to `target` until shut down.
struct Forwarder {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
    /// Freezes the connections open now (see [`Forwarder::freeze`]).
    freeze: Arc<tokio::sync::Notify>,
}

impl Forwarder {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let spawned = tasks.clone();
        let freeze = Arc::new(tokio::sync::Notify::new());
        let frozen = freeze.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let frozen = frozen.clone();
                let tunnel = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        // The freeze is looked at first: polled the other way round, a
                        // statement written just after `freeze` could still be forwarded (and
                        // run) before the freeze is seen, only its answer held back.
                        tokio::select! {
                            biased;
                            () = frozen.notified() => {
                                // Both sockets stay open, and nothing crosses any more.
                                std::future::pending::<()>().await;
                            }
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        }
                    }
                });
                spawned.lock().unwrap().push(tunnel);
            }
        });
        Self {
            port,
            tasks,
            accept,
            freeze,
        }
    }

    /// Every connection open now stops forwarding either way, its sockets left open (a black
    /// hole: no error, no answer); connections opened later are forwarded.
    fn freeze(&self) {
        self.freeze.notify_waiters();
    }

    /// Closes the port and cuts every forwarded connection.
    async fn shut_down(self) {
        self.accept.abort();
        let _ = self.accept.await;
        let tunnels: Vec<_> = std::mem::take(&mut *self.tasks.lock().unwrap());
        for tunnel in tunnels {
            tunnel.abort();
            let _ = tunnel.await;
        }
    }
}

/// `base`'s database through `forwarder`.
fn through(base: &Dsn, forwarder: &Forwarder) -> Dsn {
    let credentials = match (base.user(), base.password()) {
        (Some(user), Some(password)) => format!("{user}:{password}@"),
        (Some(user), None) => format!("{user}@"),
        _ => String::new(),
    };
    Dsn::parse(&format!(
        "postgres://{credentials}127.0.0.1:{}{}",
        forwarder.port,
        base.path()
    ))
    .unwrap()
}

/// `host:port` of `base`.
fn target(base: &Dsn) -> String {
    format!(
        "{}:{}",
        base.host().unwrap_or("127.0.0.1"),
        base.port().unwrap_or(5432)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn a_database_lost_mid_run_is_named_within_the_acquire_timeout() {
    let base = Dsn::parse(&courier_test::env::postgres_url()).unwrap();
    let cleanup = courier_test::Cleanup::new();
    let forwarder = Forwarder::start(target(&base)).await;
    let table = cleanup.postgres_table("outage");
    let dsn = through(&base, &forwarder)
        .with_option("table_name", table.as_str())
        .with_option("acquire_timeout", "2s")
        .with_option("max_connections", "2");
    let transport = SqlTransport::connect("outage", &dsn, courier_test::registry())
        .await
        .unwrap();
    let envelope = Envelope::new(courier_test::TestMessage::new(1));
    transport.send(envelope).await.unwrap();
    let got = transport.get(1).await.unwrap();
    assert_eq!(got.len(), 1);
    transport.ack(&got[0]).await.unwrap();

    forwarder.shut_down().await;
    let claim = tokio::time::timeout(Duration::from_secs(20), transport.get(1)).await;
    let err = claim
        .expect("the claim gave up within the acquire timeout and one explaining attempt")
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Connection, "{err:?}");
    assert!(err.is_transient(), "the worker retries it: {err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("refused"), "the cause is named: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn once_a_statement_on_a_silent_path_is_given_up_the_next_runs_on_a_new_connection() {
    let base = Dsn::parse(&courier_test::env::postgres_url()).unwrap();
    let cleanup = courier_test::Cleanup::new();
    let forwarder = Forwarder::start(target(&base)).await;
    let table = cleanup.postgres_table("silent");
    let dsn = through(&base, &forwarder)
        .with_option("table_name", table.as_str())
        .with_option("max_connections", "4");
    let transport = SqlTransport::connect("silent", &dsn, courier_test::registry())
        .await
        .unwrap();
    for i in 0..4 {
        let envelope = Envelope::new(courier_test::TestMessage::new(i));
        transport.send(envelope).await.unwrap();
    }
    // Four connections in the pool, idle: four claims at once open them.
    let claims = futures_util::future::join_all((0..4).map(|_| transport.get(1))).await;
    let mut claimed = Vec::new();
    for got in claims {
        claimed.extend(got.unwrap());
    }
    assert_eq!(claimed.len(), 4, "one each");
    transport
        .retry(claimed.remove(0), Duration::ZERO)
        .await
        .unwrap();

    forwarder.freeze();
    // The worker's bound, shortened: the claim on a silent connection is given up.
    let silent = tokio::time::timeout(Duration::from_secs(3), transport.get(1)).await;
    assert!(silent.is_err(), "the frozen path answered: {silent:?}");
    // The next claim is not handed another silent connection from the pool.
    let started = std::time::Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(20), transport.get(1))
        .await
        .expect("the next claim waited on another silent pooled connection")
        .unwrap();
    assert_eq!(next.len(), 1, "the message put back is claimed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(transport);
    forwarder.shut_down().await;
}
