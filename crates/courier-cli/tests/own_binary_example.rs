//! `examples/own_binary.rs`, a `courier` binary built with `courier_cli::App`, as a real process:
//! its commands know the application's handler and agent (`runs submit`, `consume`, `runs
//! list`, `failed show`), where the stock `courier` binary refuses the agent; and with no
//! arguments its tour runs to exit 0.

#[path = "../../../tests/examples_support/mod.rs"]
mod examples_support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use courier::sql::SqlTransport;
use courier::{Dsn, Envelope, Message, MessageRegistry, Transport};
use examples_support::{Finished, example, run_to_end};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(60);

/// The application's message as another producer would write it: the same wire name and fields.
#[derive(Serialize, Deserialize)]
struct WelcomeEmail {
    to: String,
}
impl Message for WelcomeEmail {
    const NAME: &'static str = "mail.welcome";
}

fn command(bin: &Path, config: &Path, args: &[&str]) -> Finished {
    let mut command = Command::new(bin);
    command
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("COURIER_CONFIG")
        .env_remove("RUST_LOG");
    let done = run_to_end(command, LIMIT);
    assert!(
        done.status.success(),
        "{} {args:?}: {:?}\nstdout: {}\nstderr: {}",
        bin.display(),
        done.status,
        done.stdout,
        done.stderr
    );
    done
}

fn json(done: &Finished) -> Value {
    serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", done.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn its_commands_know_the_applications_handler_and_agent() {
    let bin = example("own_binary");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("courier.db");
    let config = dir.path().join("courier.toml");
    std::fs::write(
        &config,
        format!(
            "[transports.async]\ndsn = \"sqlite://{db}\"\nfailure_transport = \"failed\"\n\n\
             [transports.failed]\ndsn = \"sqlite://{db}?queue_name=failed\"\n\n\
             [routing]\n\"courier.run_agent\" = \"async\"\n\n[runs]\nstore = \"sqlite://{db}\"\n",
            db = db.display()
        ),
    )
    .expect("write courier.toml");
    command(&bin, &config, &["-q", "setup"]);

    // The stock binary has no `onboarding` agent.
    let mut stock = Command::new(env!("CARGO_BIN_EXE_courier"));
    stock
        .arg("--config")
        .arg(&config)
        .env_remove("COURIER_CONFIG");
    stock.args(["runs", "submit", "onboarding", "--input", "{}"]);
    let refused = run_to_end(stock, LIMIT);
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("unknown agent `onboarding`"),
        "{}",
        refused.stderr
    );

    // The application's producer puts two mails on the queue; the binary submits a run.
    let dsn = Dsn::parse(&format!("sqlite://{}", db.display())).expect("DSN");
    let registry = Arc::new(MessageRegistry::new().with::<WelcomeEmail>());
    let queue = SqlTransport::connect("async", &dsn, registry)
        .await
        .expect("the queue");
    for to in ["ada@example.com", "nobody"] {
        queue
            .send(Envelope::new(WelcomeEmail { to: to.into() }))
            .await
            .expect("send");
    }
    let submitted = command(
        &bin,
        &config,
        &[
            "runs",
            "submit",
            "onboarding",
            "--input",
            r#"{"user":"ada"}"#,
        ],
    );
    let run_id = submitted.stdout.trim().to_owned();

    let consumed = command(&bin, &config, &["-q", "consume", "--limit", "3"]);
    assert!(
        consumed
            .stdout
            .contains("welcome mail sent to ada@example.com"),
        "the handler ran: {}",
        consumed.stdout
    );
    assert!(
        consumed.stdout.contains("onboarded ada"),
        "the agent ran: {}",
        consumed.stdout
    );

    let runs = json(&command(
        &bin,
        &config,
        &["--format", "json", "runs", "list"],
    ));
    let runs = runs.as_array().expect("a list of runs");
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["id"], run_id.as_str());
    assert_eq!(runs[0]["agent"], "onboarding");
    assert_eq!(runs[0]["status"], "completed");
    assert_eq!(runs[0]["output"]["user"], "ada");

    // The mail the handler refused is in the failure transport, with the handler's reason.
    let failed = command(&bin, &config, &["--format", "json", "failed", "show"]);
    let failed = json(&failed);
    let failed = failed.as_array().expect("a list of failed messages");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let row = failed[0].to_string();
    assert!(row.contains("mail.welcome"), "{row}");
    assert!(row.contains("is not an email address"), "{row}");
}

#[test]
fn with_no_arguments_its_tour_runs_every_command_to_exit_0() {
    let bin = example("own_binary");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut tour = Command::new(bin);
    tour.current_dir(dir.path())
        .env_remove("COURIER_CONFIG")
        .env_remove("RUST_LOG");
    let done = run_to_end(tour, LIMIT);
    assert!(
        done.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        done.status,
        done.stdout,
        done.stderr
    );
    for line in [
        "welcome mail sent to ada@example.com",
        "onboarded ada",
        "completed  onboarding",
        "1 failed message(s)",
    ] {
        assert!(done.stdout.contains(line), "{line:?} in {}", done.stdout);
    }
}
