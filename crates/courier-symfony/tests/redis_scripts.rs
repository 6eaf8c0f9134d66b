//! A `get` moves the due delayed messages and reads the stream in one round trip; when the
//! server has lost the move's script (`SCRIPT FLUSH`, or a new server behind the address), what
//! the read delivered is still handed out, the script is loaded again, and the delayed message
//! moves at the next `get`.
//!
//! The server is a private `redis-server` on a free loopback port (a flush of the shared one
//! would disturb other tests' scripts), killed when the test ends.

#![cfg(all(unix, feature = "redis"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use courier_core::{DelayStamp, Envelope, Message, MessageRegistry, Transport};
use courier_symfony::{RedisOptions, RedisTransport, SymfonySerializer, SymfonyTypes};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ping {
    n: u32,
}

impl Message for Ping {
    const NAME: &'static str = "app.ping";
}

/// A `redis-server` of this test's own, killed on drop.
struct PrivateRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PrivateRedis {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/services installs it)");
        // Owned at once, so that a failure below still kills and waits for it (Drop).
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the private redis-server did not listen on port {port} within 5 s");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn n(envelope: &Envelope) -> u32 {
    envelope.message::<Ping>().expect("a Ping").n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_move_script_loses_nothing_and_is_loaded_again() {
    let server = PrivateRedis::start().await;
    let transport = RedisTransport::connect(
        "async",
        "127.0.0.1",
        server.port,
        RedisOptions::default().stream("flushed").consumer("rust-1"),
        SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\Ping", "app.ping")),
        Arc::new(MessageRegistry::new().with::<Ping>()),
    )
    .await
    .unwrap();

    // The script is on the server after a first get.
    assert!(transport.get(10).await.unwrap().is_empty());
    transport
        .send_batch(vec![
            Envelope::new(Ping { n: 1 }),
            Envelope::new(Ping { n: 2 }).with(DelayStamp(Duration::from_millis(1))),
        ])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server.port)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();

    // The move fails (NOSCRIPT); the read beside it still delivers the entry that was there.
    let first = transport.get(10).await.expect("the read's entries");
    assert_eq!(first.iter().map(n).collect::<Vec<_>>(), vec![1]);
    transport.ack_batch(&first).await.unwrap();

    // The script was loaded again: the due delayed message moves and is read.
    let second = transport.get(10).await.expect("the script loaded again");
    assert_eq!(second.iter().map(n).collect::<Vec<_>>(), vec![2]);
    transport.ack_batch(&second).await.unwrap();
    let delayed: u64 = redis::cmd("ZCARD")
        .arg("flushed__queue")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(delayed, 0, "nothing left waiting");
}
