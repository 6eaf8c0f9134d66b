//! `examples/axum_service.rs` as a real process: an order posted over HTTP is written with its
//! message in one transaction, handled by the worker running in the same process (and its
//! receipt run completed), then SIGTERM drains the service and it exits 0.

mod examples_support;

use std::process::Command;
use std::time::Duration;

use examples_support::{Running, example, http};

/// Bounds on waits (a slow machine gets this long; the assertions are on what happened).
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn an_order_is_handled_in_process_and_sigterm_drains_the_service_to_exit_0() {
    let bin = example("axum_service");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("shop.db");
    let mut command = Command::new(bin);
    command.arg("--serve").arg("--db").arg(&db);
    let mut service = Running::start(command);

    let listening = service.wait_for("listening on http://", LIMIT);
    let addr = listening
        .rsplit("http://")
        .next()
        .expect("an address")
        .trim()
        .to_owned();

    let (status, body) = http(&addr, "POST", "/orders", r#"{"item":"tea"}"#);
    assert_eq!(status, 201, "POST /orders: {body}");
    assert_eq!(body, r#"{"order":1}"#);

    // The worker in the process handled the message, and the run it enqueued completed.
    service.wait_for("order 1 confirmed", LIMIT);
    service.wait_for("receipt for order 1 sent", LIMIT);
    let (status, body) = http(&addr, "GET", "/orders/1", "");
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"order":1,"status":"receipt_sent"}"#);

    service.signal("TERM");
    service.wait_for("stopping: no new requests", LIMIT);
    let status = service.exit_status(LIMIT);
    assert!(
        status.success(),
        "exit {status:?}; printed: {:#?}",
        service.seen
    );
    assert!(
        service
            .seen
            .iter()
            .any(|l| l == "drained: 2 message(s) handled"),
        "the worker reported what it handled: {:#?}",
        service.seen
    );
    // Stopped: nothing listens there any more.
    assert!(std::net::TcpStream::connect(&addr).is_err());
}
