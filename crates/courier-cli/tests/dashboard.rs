//! `courier dashboard`: the command serves the configuration's dashboard on loopback, answers
//! only loopback host names, and stops on SIGTERM.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::Env;

/// Kills the dashboard when the test ends, even on a panic.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(port: u16, path: &str, host: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn the_dashboard_command_serves_the_configuration_on_loopback() {
    let env = Env::with_config();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut running = Running(
        env.command(&["dashboard", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the dashboard did not listen");
        assert!(
            running.0.try_wait().unwrap().is_none(),
            "the dashboard exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let host = format!("127.0.0.1:{port}");
    let stats = get(port, "/api/stats", &host);
    assert!(stats.starts_with("HTTP/1.1 200"), "{stats}");
    assert!(
        stats.contains(r#""async":0"#) && stats.contains(r#""failed":0"#),
        "{stats}"
    );
    let runs = get(port, "/runs", &host);
    assert!(
        runs.starts_with("HTTP/1.1 200") && runs.contains("No runs match."),
        "{runs}"
    );
    let rebound = get(port, "/api/stats", &format!("attacker.example:{port}"));
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");

    let pid = running.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = running.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop it");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}
