//! The `courier` binary a user builds (`cargo build -p courier`, default features) has no fault
//! points: the variables that once made `courier relay` write a file and stop forever at a chosen
//! point of its first batch (`COURIER_RELAY_PAUSE`, `COURIER_RELAY_PAUSE_FILE`) change nothing.
//! The crash tests pause a relay through their own binary (courier-chaos's `outbox-worker`,
//! which injects the pause with `courier_cli::App::configure_relay`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use courier::sql::SqlTransport;
use courier::{Dsn, Envelope, MessageCount, Transport};
use courier_test::{TestMessage, registry};

const MESSAGES: u64 = 12;

async fn sqlite(dir: &Path, file: &str) -> SqlTransport {
    let dsn = format!("sqlite://{}?mode=rwc", dir.join(file).display());
    let dsn = Dsn::parse(&dsn).expect("a valid DSN");
    SqlTransport::connect("t", &dsn, registry())
        .await
        .expect("open the SQLite queue")
}

async fn count(t: &SqlTransport) -> u64 {
    t.message_count().await.expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn courier_relay_ignores_the_old_pause_variables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let outbox = Arc::new(sqlite(dir.path(), "outbox.db").await);
    let dest = sqlite(dir.path(), "dest.db").await;
    for seq in 0..MESSAGES {
        outbox
            .send(Envelope::new(TestMessage::new(seq)))
            .await
            .expect("send");
    }
    let config = dir.path().join("courier.toml");
    std::fs::write(
        &config,
        "[transports.outbox]\ndsn = \"sqlite://outbox.db\"\n\n\
         [transports.dest]\ndsn = \"sqlite://dest.db\"\n",
    )
    .expect("write courier.toml");

    for point in ["after_confirm", "after_delete", "not_a_point"] {
        let pause_file = dir.path().join(format!("{point}.pause"));
        let before = count(&dest).await;
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_courier"))
            .arg("--config")
            .arg(&config)
            .args(["-q", "relay", "--from", "outbox", "--to", "dest"])
            .args(["--batch-size", "2", "--limit", "4"])
            .current_dir(dir.path())
            .env("COURIER_RELAY_PAUSE", point)
            .env("COURIER_RELAY_PAUSE_FILE", &pause_file)
            .env_remove("COURIER_CONFIG")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "COURIER_RELAY_PAUSE={point}: `courier relay --limit 4` did not finish within \
                     60 s (pause file written: {})",
                    pause_file.exists()
                )
            })
            .expect("run courier");
        assert!(
            output.status.success(),
            "COURIER_RELAY_PAUSE={point}: courier relay exited with {:?}: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            !pause_file.exists(),
            "COURIER_RELAY_PAUSE={point}: courier relay wrote {}",
            pause_file.display()
        );
        assert_eq!(
            count(&dest).await,
            before + 4,
            "COURIER_RELAY_PAUSE={point}: the relay forwards its 4 messages"
        );
    }
    assert_eq!(count(&outbox).await, 0, "every message relayed");
}
