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

fn post(port: u16, path: &str, host: &str, form: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The run page of `courier dashboard` sends a waiting run its signal through a runtime on the
/// configuration's bus: the woken run's message reaches the worker's transport.
#[test]
fn the_dashboard_command_sends_a_waiting_run_its_signal() {
    let env = Env::with_config();
    let id = env.submit(r#"{"steps":[{"wait_signal":"go"},{"output":"went"}]}"#);
    env.run(&["consume", "async", "--limit", "1", "--sleep", "20ms"])
        .ok();
    assert_eq!(env.show(&id)["status"], "waiting");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let running = Running(
        env.command(&["dashboard", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the dashboard did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let host = format!("127.0.0.1:{port}");
    let page = get(port, &format!("/runs/{id}"), &host);
    assert!(
        page.contains(&format!(r#"action="/runs/{id}/signal""#)),
        "{page}"
    );
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a csrf field: {page}"))
        .to_owned();
    let answer = post(
        port,
        &format!("/runs/{id}/signal"),
        &host,
        &format!("name=go&data=%7B%22n%22%3A1%7D&by=ops&confirmed=1&csrf={csrf}"),
    );
    assert!(answer.starts_with("HTTP/1.1 303"), "{answer}");
    drop(running);
    assert_eq!(env.show(&id)["status"], "queued");
    let stats = env.run(&["stats", "async", "--format", "json"]).json();
    assert_eq!(stats["async"], 1, "the woken run was dispatched: {stats}");
    env.run(&["consume", "async", "--limit", "1", "--sleep", "20ms"])
        .ok();
    let run = env.show(&id);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["steps"][0]["output"]["received"]["data"]["n"], 1,
        "{run}"
    );
}
