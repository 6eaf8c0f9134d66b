//! A broker or database that is down when `consume` starts: every transport kind (and the run
//! store) is retried with backoff and a log line naming it, its redacted DSN and the error, until
//! SIGTERM, which exits 0.

#![cfg(unix)]

mod common;

use std::io::Read;
use std::time::Duration;

use common::{Env, signal, wait};

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `consume` on `config`, lets it retry for a while, stops it with SIGTERM and returns
/// its stderr.
fn consume_while_down(env: &Env, config: &str) -> String {
    env.write("down.toml", config);
    let child = env.spawn(&["--config", "down.toml", "consume", "--sleep", "20ms"]);
    std::thread::sleep(Duration::from_millis(2_500));
    let mut child = child;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "consume gave up instead of retrying: {}",
        {
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                let _ = e.read_to_string(&mut err);
            }
            err
        }
    );
    signal(&child, "TERM");
    let out = wait(child, Duration::from_secs(10));
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stderr
}

fn assert_retried(stderr: &str, what: &str) {
    assert!(stderr.contains(what), "names {what}: {stderr}");
    assert!(
        stderr.matches("is unavailable").count() >= 2,
        "retried and logged each attempt: {stderr}"
    );
    assert!(stderr.contains("retrying in"), "{stderr}");
    assert!(!stderr.contains("hunter2secret"), "{stderr}");
}

#[cfg(feature = "redis")]
#[test]
fn consume_retries_a_redis_server_that_is_down_until_sigterm() {
    let env = Env::empty();
    let port = closed_port();
    let stderr = consume_while_down(
        &env,
        &format!("[transports.async]\ndsn = \"redis://:hunter2secret@127.0.0.1:{port}\"\n"),
    );
    assert_retried(&stderr, "transport `async`");
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
}

/// The same with a token in the user's place: the log lines name the server, not the token.
#[cfg(feature = "redis")]
#[test]
fn retry_logs_never_show_a_redis_token() {
    let env = Env::empty();
    let port = closed_port();
    let stderr = consume_while_down(
        &env,
        &format!("[transports.async]\ndsn = \"redis://hunter2token@127.0.0.1:{port}\"\n"),
    );
    assert_retried(&stderr, "transport `async`");
    assert!(
        stderr.contains(&format!("***@127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2token"), "{stderr}");
}

#[cfg(feature = "postgres")]
#[test]
fn consume_retries_a_database_that_is_down_until_sigterm() {
    let env = Env::empty();
    let port = closed_port();
    let stderr = consume_while_down(
        &env,
        &format!(
            "[transports.async]\ndsn = \"postgres://app:hunter2secret@127.0.0.1:{port}/app\"\n"
        ),
    );
    assert_retried(&stderr, "transport `async`");
}

#[cfg(feature = "postgres")]
#[test]
fn consume_retries_a_run_store_that_is_down_until_sigterm() {
    let env = Env::empty();
    let port = closed_port();
    let stderr = consume_while_down(
        &env,
        &format!(
            "[transports.async]\ndsn = \"sqlite://courier.db\"\n[routing]\n\"courier.run_agent\" = \"async\"\n\
             [runs]\nstore = \"postgres://app:hunter2secret@127.0.0.1:{port}/app\"\n"
        ),
    );
    assert_retried(&stderr, "run store");
}
