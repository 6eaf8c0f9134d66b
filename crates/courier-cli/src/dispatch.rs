//! Parses the command line, installs logging, loads the configuration and runs the command.

use std::ffi::OsString;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::filter::LevelFilter;

use crate::cli::{Cli, Command};
use crate::commands;
use crate::context::Ctx;
use crate::error::{CliError, CliResult};
use crate::telemetry::Telemetry;
use crate::wiring::Wiring;

/// Runs the command line and returns the exit code.
pub(crate) fn run<I, T>(app: Wiring, args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    // Held to the end: dropping it flushes the spans not exported yet.
    let _telemetry = init_logging(&cli);
    match execute(&app, cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

fn init_logging(cli: &Cli) -> Telemetry {
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => LevelFilter::ERROR,
        (false, 0) => LevelFilter::WARN,
        (false, 1) => LevelFilter::INFO,
        (false, 2) => LevelFilter::DEBUG,
        (false, _) => LevelFilter::TRACE,
    };
    crate::telemetry::init(level, cli.verbose >= 2)
}

fn execute(app: &Wiring, cli: Cli) -> CliResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async {
        // `bench` and `demo` make their own configuration; every other command loads one.
        match cli.command {
            Command::Bench(ref args) => commands::bench::run(app, &cli, args).await,
            #[cfg(feature = "runs")]
            Command::Demo(ref args) => commands::demo::run(app, &cli, args).await,
            #[cfg(not(feature = "runs"))]
            Command::Demo(_) => Err(CliError::usage("`demo` needs the `runs` feature")),
            ref command => {
                let ctx = Ctx::load(app, &cli)?;
                #[cfg(feature = "agent")]
                let configured = crate::agents::wiring(&ctx)?;
                #[cfg(feature = "agent")]
                let ctx = match &configured {
                    Some(wiring) => ctx.with_app(wiring),
                    None => ctx,
                };
                commands::run(&ctx, command).await
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}
