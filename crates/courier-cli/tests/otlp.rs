//! With the `otel` feature, `courier` exports its spans over OTLP/HTTP to the collector that
//! `OTEL_EXPORTER_OTLP_ENDPOINT` names (here a fake one on loopback that records each request).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use common::{Env, wait};

/// One HTTP request the fake collector received.
struct Request {
    line: String,
    body: Vec<u8>,
}

/// Accepts connections on 127.0.0.1, answers every request `200 OK`, and hands each on.
fn collector() -> (String, mpsc::Receiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut reader = BufReader::new(stream);
            // Keep-alive: several requests may come on one connection. Each is handed on before
            // the reply, so it is there once the exporter has its answer.
            while let Some(request) = read_request(&mut reader) {
                let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                if tx.send(request).is_err()
                    || reader.get_mut().write_all(reply.as_bytes()).is_err()
                {
                    break;
                }
            }
        }
    });
    (url, rx)
}

fn read_request(reader: &mut impl BufRead) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        line: line.trim_end().to_owned(),
        body,
    })
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn consume_exports_its_process_spans_to_the_otlp_endpoint() {
    let (url, requests) = collector();
    let env = Env::with_config();
    env.submit(r#"{"steps":[{"output":"ok"}]}"#);
    let child = env
        .command(&[
            "consume",
            "--limit",
            "1",
            "--sleep",
            "20ms",
            "--time-limit",
            "30s",
        ])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait(child, Duration::from_secs(60)).ok();

    // The exporter flushed at exit: everything it sent has arrived.
    let sent: Vec<Request> = requests.try_iter().collect();
    assert!(!sent.is_empty(), "no request reached the collector");
    assert!(
        sent.iter().all(|r| r.line.starts_with("POST /v1/traces ")),
        "{:?}",
        sent.iter().map(|r| &r.line).collect::<Vec<_>>()
    );
    let body: Vec<u8> = sent.into_iter().flat_map(|r| r.body).collect();
    // Protobuf carries strings as they are.
    for expected in [
        "process async",
        "messaging.destination.name",
        "messaging.message.id",
        "courier.run_agent",
        "courier",
    ] {
        assert!(contains(&body, expected), "`{expected}` not exported");
    }
}
