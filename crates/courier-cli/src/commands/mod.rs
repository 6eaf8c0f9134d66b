//! One file per command group.

pub(crate) mod bench;
mod consume;
#[cfg(feature = "dashboard")]
mod dashboard;
#[cfg(feature = "runs")]
pub(crate) mod demo;
mod failed;
mod progress;
mod relay;
#[cfg(feature = "runs")]
mod runs;
mod schedules;
mod setup;
mod stats;
mod stats_keys;
mod stop;
mod workers;

use crate::cli::Command;
use crate::context::Ctx;
use crate::error::{CliError, CliResult};

/// Runs a command that uses the loaded configuration.
pub(crate) async fn run(ctx: &Ctx<'_>, command: &Command) -> CliResult {
    match command {
        Command::Setup {
            transports,
            print_sql: true,
            dialect,
            table,
        } => setup::print_sql(ctx, transports, dialect.as_deref(), table.as_deref()),
        Command::Setup { transports, .. } => setup::run(ctx, transports).await,
        Command::Consume(args) => consume::run(ctx, args).await,
        Command::Relay(args) => relay::run(ctx, args).await,
        Command::Stats {
            transports, keys, ..
        } if *keys => stats_keys::run(ctx, transports).await,
        Command::Stats {
            transports,
            oldest,
            breakers,
            ..
        } => stats::run(ctx, transports, *oldest, *breakers).await,
        Command::Failed(cmd) => failed::run(ctx, cmd).await,
        Command::StopWorkers => stop::run(ctx).await,
        Command::Workers => workers::run(ctx).await,
        Command::Schedules => schedules::run(ctx).await,
        Command::Pause { transport } => schedules::pause(ctx, transport, true).await,
        Command::Resume { transport } => schedules::pause(ctx, transport, false).await,
        #[cfg(feature = "runs")]
        Command::Runs(cmd) => runs::run(ctx, cmd).await,
        #[cfg(feature = "runs")]
        Command::Reap(args) => runs::reap(ctx, args).await,
        #[cfg(not(feature = "runs"))]
        Command::Runs(_) | Command::Reap(_) => {
            Err(CliError::usage("this build has no `runs` feature"))
        }
        #[cfg(feature = "dashboard")]
        Command::Dashboard(args) => dashboard::run(ctx, args).await,
        #[cfg(not(feature = "dashboard"))]
        Command::Dashboard(_) => Err(CliError::usage("this build has no `dashboard` feature")),
        Command::Demo(_) | Command::Bench(_) => Err(CliError::runtime(
            "internal: handled before loading the configuration",
        )),
    }
}
