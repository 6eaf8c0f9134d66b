//! `courier consume --metrics ADDR` serves Prometheus text whose counters equal what was done.

#![cfg(unix)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::{Env, eventually, signal, wait};

/// A port free right now on the loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A raw `GET path`; the status line and the body, or `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// One sample: metric name and labels.
type Series = (String, BTreeMap<String, String>);

/// Parses Prometheus text into samples.
fn parse(text: &str) -> BTreeMap<Series, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let labels = rest
                    .trim_end_matches('}')
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (k, v) = l.split_once('=').expect("a label");
                        (k.to_owned(), v.trim_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        out.insert((name, labels), value.parse().expect("a number"));
    }
    out
}

fn value(samples: &BTreeMap<Series, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    samples
        .get(&(name.to_owned(), labels))
        .copied()
        .unwrap_or(0.0)
}

#[test]
fn the_scraped_counters_equal_what_the_worker_did() {
    let env = Env::with_config();
    env.run(&["setup"]).ok();
    // 3 runs to handle, 2 messages that do not decode (moved to `failed` at once).
    for _ in 0..3 {
        env.submit(r#"{"steps":[{"output":"done"}]}"#);
    }
    for _ in 0..2 {
        env.sql(
            "INSERT INTO courier_messages (queue_name, body, headers, priority, created_at, available_at) \
             VALUES ('default', '{\"x\":1}', '{\"type\":\"app.unknown\",\"content-type\":\"application/json\"}', 0, 0, 0)",
        );
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let child = env.spawn(&[
        "consume",
        "async",
        "--metrics",
        &addr,
        "--sleep",
        "20ms",
        "--quiet",
    ]);

    let runs = [
        ("transport", "async"),
        ("message_type", "courier.run_agent"),
    ];
    let unknown = [("transport", "async"), ("message_type", "app.unknown")];
    let mut samples = BTreeMap::new();
    eventually("the worker to handle every message", || {
        let Some((status, body)) = get(port, "/metrics") else {
            return false;
        };
        assert_eq!(status, "HTTP/1.1 200 OK");
        samples = parse(&body);
        value(&samples, "courier_messages_handled_total", &runs) >= 3.0
            && value(
                &samples,
                "courier_messages_moved_to_failure_total",
                &unknown,
            ) >= 2.0
    });
    // Counted once each, exactly.
    assert_eq!(
        value(&samples, "courier_messages_received_total", &runs),
        3.0
    );
    assert_eq!(
        value(&samples, "courier_messages_handled_total", &runs),
        3.0
    );
    assert_eq!(value(&samples, "courier_messages_failed_total", &runs), 0.0);
    assert_eq!(
        value(&samples, "courier_messages_received_total", &unknown),
        2.0
    );
    assert_eq!(
        value(&samples, "courier_messages_failed_total", &unknown),
        2.0
    );
    assert_eq!(
        value(&samples, "courier_messages_handled_total", &unknown),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "courier_messages_moved_to_failure_total",
            &unknown
        ),
        2.0
    );
    assert_eq!(
        value(&samples, "courier_messages_retried_total", &unknown),
        0.0
    );
    assert_eq!(
        value(&samples, "courier_runs_total", &[("outcome", "completed")]),
        3.0
    );
    assert_eq!(
        value(&samples, "courier_handler_duration_seconds_count", &runs),
        3.0
    );
    // The queue depth is sampled at start, and the heartbeat ticks.
    assert!(
        samples
            .keys()
            .any(|(name, labels)| name == "courier_queue_depth"
                && labels.get("transport").map(String::as_str) == Some("failed")),
        "{samples:?}"
    );
    assert!(value(&samples, "courier_worker_heartbeats_total", &[]) >= 1.0);

    // Anything but GET /metrics is refused.
    let (status, _) = get(port, "/other").expect("a response");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    signal(&child, "TERM");
    let out = wait(child, Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn an_address_that_cannot_be_bound_is_a_usage_error() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let env = Env::with_config();
    let out = env.run(&["consume", "--metrics", &addr, "--time-limit", "5s"]);
    let stderr = out.fails(2);
    assert!(stderr.contains("--metrics"), "{stderr}");
}
