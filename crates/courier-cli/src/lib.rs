//! The `courier` command line as a library, so an application builds its own binary with its own
//! handlers, agents and transports and gets the same commands:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     courier_cli::App::new().run()
//! }
//! ```
//!
//! Commands: `setup`, `consume`, `relay`, `stats`, `failed show|retry|remove`, `stop-workers`,
//! `workers`, `schedules`, `pause`, `resume`,
//! `runs submit|show|list|events|cancel|requeue|signal|resolve|fork|approve|input|prune`, `reap`,
//! `demo`, `dashboard` (feature `dashboard`), `bench`; every flag is in the book's command-line
//! reference (`docs/src/reference/cli.md`, generated from these definitions). Global flags:
//! `--config FILE` (else `COURIER_CONFIG`, else `./courier.toml`, else [`EMBEDDED_CONFIG`]),
//! `-v`/`-q`, `--format text|json`. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration
//! error, 130 a `consume` forced to exit by a second SIGINT/SIGTERM.
//!
//! `consume` and servers that are down: when a broker or database (a transport or the run store)
//! cannot be reached at start, `consume` retries with capped exponential backoff (0.5 s doubling
//! up to 30 s), logging each attempt at WARN with what it tried to reach, its redacted DSN and the
//! error, until it comes up or the worker is stopped (exit 0). A DSN or option that is wrong exits
//! 2 at once. The first SIGINT/SIGTERM stops gracefully within `--grace`; a second one exits at
//! once (130) after logging how many in-flight messages it leaves for redelivery.
//!
//! Every `consume` registers in the configuration's worker registry (a SQL transport's
//! `<table>_workers` table, a Redis transport's `<group>:workers` hash, else the SQL run store's
//! database) with its id (`--worker-id`, default `host:pid:random`), host, pid, version,
//! transports and counts, heartbeats every `--registry-heartbeat` (2 s) and unregisters on exit.
//! `workers` lists them; `stop-workers` flags them all, and each stops gracefully, as on
//! SIGTERM, at its next heartbeat, on whatever host it runs. Only without any shared store does
//! `stop-workers` write the current time to a stop file next to the configuration
//! (`courier.toml.stop-workers`, or `./courier.stop-workers` with the embedded configuration),
//! which such a `consume` checks twice a second.

#[cfg(feature = "agent")]
mod agents;
mod app;
mod cli;
mod commands;
mod connect;
mod context;
mod dispatch;
#[cfg(doctest)]
mod doctests;
mod error;
mod metrics;
#[cfg(test)]
mod reference;
mod registry;
#[cfg(feature = "runs")]
mod runs;
mod schedules;
mod table;
mod telemetry;
mod wiring;

pub use app::App;
pub use context::EMBEDDED_CONFIG;

/// Runs the `courier` command line with the built-in handlers and agents (this package's binary).
#[must_use]
pub fn main() -> std::process::ExitCode {
    App::new().run()
}
