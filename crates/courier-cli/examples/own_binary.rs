//! Your own `courier` binary: the command line built with `courier_cli::App`, with the
//! application's message handlers and agents registered, so that every command (`consume`,
//! `runs`, `failed`, `dashboard`, ...) can decode, handle and show them. The stock `courier`
//! binary knows none of them: it moves an application message it cannot decode to the failure
//! transport, and refuses to submit a run of an agent it does not have.
//!
//! ```sh
//! cargo run --example own_binary -- --config courier.toml consume   # any courier command
//! cargo run --example own_binary                                     # a tour on a temporary file
//! ```
//!
//! In an application this is `src/bin/courier.rs`, with `courier-cli` among its dependencies.
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use courier::runs::{Agent, AgentError, AgentOutcome, RunContext, Step};
use courier::sql::SqlTransport;
use courier::{
    Dsn, Envelope, Handler, HandlerError, Message, MessageRegistry, Transport, async_trait,
};
use courier_cli::App;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A message the application dispatches (from its web handlers, say).
#[derive(Serialize, Deserialize)]
struct WelcomeEmail {
    to: String,
}

impl Message for WelcomeEmail {
    const NAME: &'static str = "mail.welcome";
}

/// Its handler: what `consume` runs for each `mail.welcome`.
struct SendWelcome;

#[async_trait]
impl Handler<WelcomeEmail> for SendWelcome {
    async fn handle(&self, m: &WelcomeEmail, _: &Envelope) -> Result<(), HandlerError> {
        if !m.to.contains('@') {
            // Retrying will not help: straight to the failure transport (`failed show`).
            return Err(HandlerError::unrecoverable(format!(
                "{:?} is not an email address",
                m.to
            )));
        }
        println!("welcome mail sent to {}", m.to);
        Ok(())
    }
}

/// An agent: `runs submit onboarding --input '{"user": "ada"}'`, run by `consume`.
struct Onboarding;

#[async_trait]
impl Agent for Onboarding {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let user = cx.input()["user"].as_str().unwrap_or("someone").to_owned();
        cx.checkpoint(Step::new("mailbox_created", json!({ "user": user })))
            .await?;
        cx.checkpoint(Step::new("profile_filled", json!({ "user": user })))
            .await?;
        println!("onboarded {user}");
        Ok(AgentOutcome::Completed(json!({ "user": user })))
    }
}

/// The command line with everything the application brings.
fn app() -> App {
    App::new()
        .handler_named::<WelcomeEmail, _>("send_welcome", SendWelcome)
        .agent("onboarding", Onboarding)
}

fn main() -> ExitCode {
    if std::env::args_os().len() > 1 {
        return app().run();
    }
    match tour() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("own_binary tour: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// With no arguments: a few commands on a temporary SQLite file, as a shell session would run
/// them (`scripts/test` runs this).
fn tour() -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let config = write_config(dir.path())?;
    let config = config
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path"))?;
    let courier = |args: &[&str]| -> anyhow::Result<()> {
        println!("\n$ own_binary {}", args.join(" "));
        let mut all: Vec<OsString> = vec!["own_binary".into(), "--config".into(), config.into()];
        all.extend(args.iter().map(OsString::from));
        if app().run_from(all) == ExitCode::SUCCESS {
            Ok(())
        } else {
            anyhow::bail!("own_binary {} failed", args.join(" "))
        }
    };

    courier(&["setup"])?;
    // The application's side, which dispatches its messages (here straight onto the queue).
    tokio::runtime::Runtime::new()?.block_on(async {
        let db = dir.path().join("courier.db");
        let dsn = Dsn::parse(&format!("sqlite://{}", db.display()))?;
        let registry = Arc::new(MessageRegistry::new().with::<WelcomeEmail>());
        let queue = SqlTransport::connect("async", &dsn, registry).await?;
        for to in ["ada@example.com", "nobody"] {
            queue
                .send(Envelope::new(WelcomeEmail { to: to.into() }))
                .await?;
        }
        anyhow::Ok(())
    })?;
    courier(&[
        "runs",
        "submit",
        "onboarding",
        "--input",
        r#"{"user": "ada"}"#,
    ])?;
    courier(&["consume", "--limit", "3"])?;
    courier(&["runs", "list"])?;
    courier(&["failed", "show"])?;
    Ok(ExitCode::SUCCESS)
}

/// A configuration on one SQLite file in `dir`: the queue `async` (where runs go too), its
/// failure transport `failed`, and the run store.
fn write_config(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let db = dir.join("courier.db");
    let db = db.display();
    let path = dir.join("courier.toml");
    std::fs::write(
        &path,
        format!(
            r#"[transports.async]
dsn = "sqlite://{db}"
failure_transport = "failed"

[transports.failed]
dsn = "sqlite://{db}?queue_name=failed"

[routing]
"mail.*" = "async"
"courier.run_agent" = "async"

[runs]
store = "sqlite://{db}"
"#
        ),
    )?;
    Ok(path)
}
