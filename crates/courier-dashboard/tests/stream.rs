//! `GET /runs/ID/stream` over real HTTP on 127.0.0.1: a reader follows a run's token stream,
//! the dashboard restarts (its server stops, a new one serves on the same address), the reader
//! reconnects with `Last-Event-ID` and gets exactly the events after it: no gap, no duplicate.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
use courier_core::async_trait;
use courier_dashboard::{DashboardOptions, StreamEventView, StreamSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The stream store both dashboards read (it outlives them, as the run store's table does).
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<(String, StreamEventView)>>>);

impl Events {
    fn push(&self, run: &str, kind: &str, data: &str) {
        let mut all = self.0.lock().unwrap();
        let offset = all.iter().filter(|(r, _)| r == run).count() as i64 + 1;
        all.push((
            run.to_owned(),
            StreamEventView {
                offset,
                kind: kind.into(),
                data: data.into(),
            },
        ));
    }
}

#[async_trait]
impl StreamSource for Events {
    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<StreamEventView>, String> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, e)| r == run && e.offset > after)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

/// Serves a dashboard on `addr`; the task's abort stops it.
async fn serve(fx: &Fixture, events: &Events, addr: &str) -> (String, tokio::task::JoinHandle<()>) {
    let router = fx
        .dashboard(DashboardOptions::default().streams(Arc::new(events.clone())))
        .router();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, task)
}

/// The SSE events (id, event, data) in `text`, the data lines joined by `\n`.
fn parse(text: &str) -> Vec<(i64, String, String)> {
    let mut out = Vec::new();
    let (mut id, mut event, mut data): (Option<i64>, String, Vec<&str>) =
        (None, String::new(), vec![]);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("id: ") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("event: ") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data: ") {
            data.push(v);
        } else if line.is_empty()
            && let Some(i) = id.take()
        {
            out.push((i, std::mem::take(&mut event), data.join("\n")));
            data.clear();
        }
    }
    out
}

/// Reads the stream of `run` from `addr` (with `Last-Event-ID` when given) until `until`
/// events arrived, then `linger` more (nothing else may come), or until the server ends it.
async fn read(
    addr: &str,
    run: &str,
    last: Option<i64>,
    until: usize,
    linger: Duration,
) -> (Vec<(i64, String, String)>, bool) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let last = last.map_or_else(String::new, |l| format!("Last-Event-ID: {l}\r\n"));
    s.write_all(
        format!(
            "GET /runs/{run}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{last}\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let mut deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut reached = false;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            Ok(Err(e)) => panic!("{e}"),
        }
        if !reached && parse(&text).len() >= until {
            reached = true;
            deadline = tokio::time::Instant::now() + linger;
        }
    }
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{text}"
    );
    (parse(&text), text.ends_with("\r\n0\r\n\r\n"))
}

#[tokio::test]
async fn a_reader_resumes_with_last_event_id_after_a_restart_without_gap_or_duplicate() {
    let fx = Fixture::new().await;
    let run = fx.seeded.running.to_string();
    let events = Events::default();
    events.push(&run, "chunk", "Hel");
    events.push(&run, "chunk", "lo\nworld");
    events.push(&run, "retry", "");

    let (addr, first) = serve(&fx, &events, "127.0.0.1:0").await;
    let linger = Duration::from_millis(600);
    let (before, ended) = read(&addr, &run, None, 3, linger).await;
    assert!(!ended, "a running run's stream stays open");
    assert_eq!(
        before,
        [
            (1, "chunk".into(), "Hel".into()),
            (2, "chunk".into(), "lo\nworld".into()),
            (3, "retry".into(), String::new()),
        ]
    );

    // The dashboard restarts; meanwhile the worker streams on.
    first.abort();
    let _ = first.await;
    events.push(&run, "chunk", "Hello again");
    events.push(&run, "done", "");
    let (again, second) = serve(&fx, &events, &addr).await;
    assert_eq!(again, addr, "the same address");
    let (after, _) = read(&addr, &run, Some(before.last().unwrap().0), 2, linger).await;
    assert_eq!(
        after,
        [
            (4, "chunk".into(), "Hello again".into()),
            (5, "done".into(), String::new()),
        ],
        "exactly the events after Last-Event-ID"
    );
    let ids: Vec<i64> = before.iter().chain(&after).map(|e| e.0).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5], "no gap, no duplicate");

    // A finished run's stream ends once it is sent.
    let finished = fx.seeded.failed_run.to_string();
    events.push(&finished, "chunk", "bye");
    let (all, ended) = read(&addr, &finished, None, usize::MAX, linger).await;
    assert_eq!(all, [(1, "chunk".into(), "bye".into())]);
    assert!(ended, "the response ended (its last chunk sent)");
    second.abort();
}
