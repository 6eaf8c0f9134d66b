//! The dashboard in Debian's headless Chromium through chromedriver (WebDriver, `fantoccini`):
//! the overview, a run found by id and its timeline, a failed message retried from the page
//! (confirmed in the browser's dialog) and consumed by a worker, one removed, a `<script>` body
//! shown as text without running, and a queue paused and resumed from the overview. Any console
//! error fails the test; screenshots go to `$CARGO_TARGET_DIR/dashboard-screenshots/` (else
//! `target/dashboard-screenshots/`).
//!
//! Needs `COURIER_TEST_CHROMEDRIVER` (e.g. `/usr/bin/chromedriver`; `scripts/services` installs
//! `chromium` and `chromium-driver` and prints it).
#![cfg(unix)]
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::net::TcpListener as StdListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;
use courier_core::{CancellationToken, HandlerError};
use courier_dashboard::DashboardOptions;
use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use common::{Fixture, Note, SCRIPT_TEXT};

/// How long any one wait may take.
const WAIT: Duration = Duration::from_secs(15);

/// Kills chromedriver and the browser it started (its process group) when the test ends, even
/// on a panic.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Polls `check` until it answers `Some`, for at most [`WAIT`].
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// chromedriver's log of the browser's console (`goog:loggingPrefs`).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _url: &url::Url) -> (Method, Option<String>) {
        (Method::POST, Some(json!({ "type": "browser" }).to_string()))
    }
}

/// Fails on any console error so far: chromedriver's browser log (errors at load, CSP
/// violations, failed requests) and what the page's own script caught.
async fn assert_no_console_errors(client: &Client, page: &str) {
    let log = client.issue_cmd(BrowserLog).await.unwrap();
    let severe: Vec<&Value> = log
        .as_array()
        .map(|entries| entries.iter().filter(|e| e["level"] == "SEVERE").collect())
        .unwrap_or_default();
    assert!(severe.is_empty(), "console errors on {page}: {severe:?}");
    let caught = client
        .execute("return window.__courierErrors || null;", vec![])
        .await
        .unwrap();
    assert_eq!(
        caught,
        json!([]),
        "errors caught by the page on {page} (or no script)"
    );
}

async fn save(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshot_dir().join(name), png).unwrap();
}

async fn accept_dialog(client: &Client, expect: &str) {
    let text = until("the confirmation dialog", || async {
        client.get_alert_text().await.ok()
    })
    .await;
    assert!(text.contains(expect), "dialog says {text:?}");
    client.accept_alert().await.unwrap();
}

async fn click(client: &Client, css: &str) {
    let element = client.find(Locator::Css(css)).await.unwrap();
    element.click().await.unwrap();
}

/// The text of the first element `css` selects.
async fn text_of(client: &Client, css: &str) -> String {
    let element = client.find(Locator::Css(css)).await.unwrap();
    element.text().await.unwrap()
}

async fn rows(client: &Client) -> Vec<String> {
    let mut ids = Vec::new();
    for row in client.find_all(Locator::Css("tr[data-id]")).await.unwrap() {
        ids.push(row.attr("data-id").await.unwrap().unwrap_or_default());
    }
    ids
}

async fn notice(client: &Client, expect: &str) {
    until(expect, || async {
        let el = client.find(Locator::Css("#notice")).await.ok()?;
        el.text().await.ok().filter(|t| t.contains(expect))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromedriver: set COURIER_TEST_CHROMEDRIVER"]
async fn the_dashboard_works_in_a_real_browser() {
    let chromedriver = courier_test::env::chromedriver();
    tokio::time::timeout(Duration::from_secs(90), journey(&chromedriver))
        .await
        .expect("the browser journey timed out");
}

async fn journey(chromedriver: &str) {
    let fx = Fixture::new().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let stop = CancellationToken::new();
    let server = tokio::spawn(
        fx.dashboard(DashboardOptions::default().loopback_hosts(port))
            .serve(listener, stop.clone()),
    );

    let driver_port = free_port();
    let profile = tempfile::tempdir().unwrap();
    let _driver = Driver(
        Command::new(chromedriver)
            .arg(format!("--port={driver_port}"))
            // Its own process group, so that the guard can end the browser with it.
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {chromedriver}: {e}")),
    );
    let webdriver = format!("http://127.0.0.1:{driver_port}");
    until("chromedriver to listen", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", driver_port))
            .await
            .ok()
    })
    .await;
    let mut options = json!({
        "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--window-size=1360,940", "--hide-scrollbars",
            format!("--user-data-dir={}", profile.path().display()),
        ],
    });
    if let Ok(binary) = std::env::var("COURIER_TEST_CHROMIUM") {
        options["binary"] = json!(binary);
    } else if std::path::Path::new("/usr/bin/chromium").exists() {
        options["binary"] = json!("/usr/bin/chromium");
    }
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": options,
        "goog:loggingPrefs": { "browser": "ALL" },
        "unhandledPromptBehavior": "ignore",
    });
    let client = tokio::time::timeout(
        WAIT,
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities.as_object().unwrap().clone())
            .connect(&webdriver),
    )
    .await
    .expect("session timed out")
    .unwrap_or_else(|e| panic!("no WebDriver session: {e}"));

    let steps = steps(&client, &fx, &base).await;
    let _ = client.close().await;
    stop.cancel();
    let _ = tokio::time::timeout(WAIT, server).await;
    steps
}

async fn steps(client: &Client, fx: &Fixture, base: &str) {
    // The overview.
    client.goto(&format!("{base}/")).await.unwrap();
    let h1 = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("h1"))
        .await
        .unwrap();
    assert_eq!(h1.text().await.unwrap(), "Overview");
    let transports = text_of(client, "table").await;
    assert!(
        transports.contains("async") && transports.contains("failed"),
        "{transports}"
    );
    assert_no_console_errors(client, "the overview").await;

    // Find a run by id, open its timeline.
    let running = fx.seeded.running.to_string();
    client.goto(&format!("{base}/runs")).await.unwrap();
    let search = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("input[name=id]"))
        .await
        .unwrap();
    search.send_keys(&running).await.unwrap();
    save(client, "runs.png").await;
    client
        .find(Locator::XPath("//button[text()='Find']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let run_url = url::Url::parse(&format!("{base}/runs/{running}")).unwrap();
    client.wait().at_most(WAIT).for_url(&run_url).await.unwrap();
    let title = client
        .find(Locator::Css("h1"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(title.contains(&running), "{title}");
    let timeline = client.find(Locator::Css("#timeline")).await.unwrap();
    let entries = timeline.find_all(Locator::Css("li")).await.unwrap();
    assert!(
        entries.len() >= 5,
        "created, started, 2 events, heartbeat: {}",
        entries.len()
    );
    let text = timeline.text().await.unwrap();
    assert!(
        text.contains("#1 fetch") && text.contains("#2 llm_call"),
        "{text}"
    );
    assert!(text.contains("last heartbeat by worker:build-7"), "{text}");
    save(client, "run.png").await;
    assert_no_console_errors(client, "the run").await;

    // Retry a failed message from the page; a worker consumes it from `async`.
    let (handled_tx, mut handled) = tokio::sync::mpsc::unbounded_channel::<String>();
    let bus = fx
        .transports
        .bus_builder()
        .handler_fn("record", move |note: Arc<Note>| {
            let tx = handled_tx.clone();
            async move {
                let _ = tx.send(note.text.clone());
                Ok::<(), HandlerError>(())
            }
        })
        .build();
    let worker = fx
        .transports
        .worker(bus, &["async".to_owned()])
        .unwrap()
        .limit(1)
        .sleep(Duration::from_millis(50))
        .build();
    let worker_stop = CancellationToken::new();
    let worker = tokio::spawn(worker.run(worker_stop.clone()));

    let (retried, retried_text) = fx.seeded.messages[0].clone();
    client.goto(&format!("{base}/failed")).await.unwrap();
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("tr[data-id]"))
        .await
        .unwrap();
    assert_eq!(rows(client).await.len(), 4);
    save(client, "failed.png").await;
    assert_no_console_errors(client, "the failed messages").await;
    let button = format!("tr[data-id='{retried}'] button[data-action=retry]");
    click(client, &button).await;
    accept_dialog(client, &format!("Retry message {retried}")).await;
    notice(client, "Retried 1 failed message(s).").await;
    let got = tokio::time::timeout(WAIT, handled.recv())
        .await
        .expect("the worker got nothing");
    assert_eq!(
        got.as_deref(),
        Some(retried_text.as_str()),
        "the worker consumed it"
    );
    let stats = tokio::time::timeout(WAIT, worker)
        .await
        .expect("worker did not stop");
    assert_eq!(stats.unwrap().unwrap().handled, 1);
    worker_stop.cancel();
    assert!(!rows(client).await.contains(&retried), "gone from the list");

    // Remove one: dismissing the dialog keeps it, accepting removes it.
    let (removed, _) = fx.seeded.messages[1].clone();
    let button = format!("tr[data-id='{removed}'] button[data-action=remove]");
    click(client, &button).await;
    until("the dialog", || async {
        client.get_alert_text().await.ok()
    })
    .await;
    client.dismiss_alert().await.unwrap();
    assert!(
        rows(client).await.contains(&removed),
        "dismissed: still there"
    );
    click(client, &button).await;
    accept_dialog(client, &format!("Remove message {removed}")).await;
    notice(client, "Removed 1 failed message(s).").await;
    let left = rows(client).await;
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&removed));
    let listable = fx.transports.get("failed").unwrap().as_listable().unwrap();
    assert!(
        listable.find(&removed).await.unwrap().is_none(),
        "removed from the store"
    );
    assert_no_console_errors(client, "the failed messages after the actions").await;

    // A `<script>` body is text, and it did not run.
    let script = &fx.seeded.script_message;
    let error_cell = client
        .find(Locator::Css(&format!("tr[data-id='{script}']")))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        error_cell.contains("template: <b>bad</b> markup"),
        "{error_cell}"
    );
    client
        .goto(&format!("{base}/failed/failed/{script}"))
        .await
        .unwrap();
    let body = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#body"))
        .await
        .unwrap();
    assert!(body.text().await.unwrap().contains(SCRIPT_TEXT));
    let pwned = client
        .execute("return typeof window.__pwned;", vec![])
        .await
        .unwrap();
    assert_eq!(pwned, json!("undefined"), "the body's script ran");
    save(client, "failed-message.png").await;
    assert_no_console_errors(client, "the failed message").await;

    // The overview again, seconds later: the failure transport drained by two, which its rate
    // shows (depth samples at least two seconds apart).
    client.goto(&format!("{base}/")).await.unwrap();
    let table = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("table"))
        .await
        .unwrap();
    assert!(table.text().await.unwrap().contains("failed"));
    save(client, "overview.png").await;
    assert_no_console_errors(client, "the overview, after the actions").await;

    // Pause the `async` queue from its row (confirmed in the dialog): the flag its workers
    // read is set in the transport's store; Resume clears it.
    let pausable = fx.transports.get("async").unwrap().as_pausable().unwrap();
    assert!(!pausable.is_paused().await.unwrap());
    click(client, "tr[data-transport=async] button[data-action=pause]").await;
    accept_dialog(client, "Pause `async`?").await;
    notice(client, "Transport `async` paused.").await;
    assert!(pausable.is_paused().await.unwrap(), "paused in the store");
    let state = text_of(client, "tr[data-transport=async]").await;
    assert!(
        state.contains("paused") && state.contains("Resume"),
        "{state}"
    );
    save(client, "overview-paused.png").await;
    click(
        client,
        "tr[data-transport=async] button[data-action=resume]",
    )
    .await;
    accept_dialog(client, "Resume `async`?").await;
    notice(client, "Transport `async` resumed.").await;
    assert!(!pausable.is_paused().await.unwrap(), "the flag is cleared");
    assert_no_console_errors(client, "the overview, after pause and resume").await;
}
