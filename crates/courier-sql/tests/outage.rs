//! A database that goes away under a running transport (every connection cut, new ones
//! refused): the next claim fails within the pool's `acquire_timeout`, naming the cause, instead
//! of waiting the timeout out again and again. The server is reached through a TCP forwarder on
//! 127.0.0.1 that the test shuts down.
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
}

impl Forwarder {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let spawned = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let target = target.clone();
                let tunnel = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                spawned.lock().unwrap().push(tunnel);
            }
        });
        Self {
            port,
            tasks,
            accept,
        }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn a_database_lost_mid_run_is_named_within_the_acquire_timeout() {
    let base = Dsn::parse(&courier_test::env::postgres_url()).unwrap();
    let target = format!(
        "{}:{}",
        base.host().unwrap_or("127.0.0.1"),
        base.port().unwrap_or(5432)
    );
    let forwarder = Forwarder::start(target).await;
    let table = courier_test::env::unique_name("outage");
    let credentials = match (base.user(), base.password()) {
        (Some(user), Some(password)) => format!("{user}:{password}@"),
        (Some(user), None) => format!("{user}@"),
        _ => String::new(),
    };
    let through = format!(
        "postgres://{credentials}127.0.0.1:{}{}",
        forwarder.port,
        base.path()
    );
    let dsn = Dsn::parse(&through)
        .unwrap()
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

    // Clean up on the server directly.
    let pool = sqlx::PgPool::connect(&courier_test::env::postgres_url())
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
