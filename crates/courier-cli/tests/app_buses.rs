//! A bus declared in `[buses.NAME]` runs the middleware the application registered under the
//! names it lists, on dispatch and on handling.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use courier_cli::App;
use courier_core::{BusError, Envelope, Middleware, Next, async_trait};

/// Counts the envelopes it sees.
struct Audit(Arc<AtomicUsize>);

#[async_trait]
impl Middleware for Audit {
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(envelope).await
    }
}

fn courier(seen: &Arc<AtomicUsize>, config: &std::path::Path, args: &[&str]) -> u8 {
    let mut all = vec!["courier", "--quiet", "--config"];
    let config = config.to_str().expect("utf-8 path");
    all.push(config);
    all.extend_from_slice(args);
    let code = App::new()
        .middleware("audit", Audit(seen.clone()))
        .run_from(all);
    // ExitCode has no accessor: compare with the known codes.
    if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    }
}

#[test]
fn a_declared_bus_runs_its_named_middleware_on_dispatch_and_on_handling() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("courier.db");
    let db = db.to_str().expect("utf-8 path");
    let config = dir.path().join("courier.toml");
    std::fs::write(
        &config,
        format!(
            r#"
default_bus = "command"

[transports.async]
dsn = "sqlite://{db}"

[routing]
"courier.run_agent" = "async"

[runs]
store = "sqlite://{db}"

[buses.command]
middleware = ["audit"]
"#
        ),
    )
    .expect("write config");
    let seen = Arc::new(AtomicUsize::new(0));
    let script = r#"{"steps":[{"output":"done"}]}"#;
    assert_eq!(
        courier(
            &seen,
            &config,
            &["runs", "submit", "scripted", "--input", script]
        ),
        0
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the dispatch went through it"
    );
    assert_eq!(
        courier(
            &seen,
            &config,
            &["consume", "async", "--limit", "1", "--sleep", "20ms"]
        ),
        0
    );
    assert_eq!(seen.load(Ordering::SeqCst), 2, "and the handling");
}
