//! The `courier` command line as a library, so an application builds its own binary with its own
//! handlers, agents and transports and gets the same commands (DESIGN.md §6):
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     courier_cli::App::new().run()
//! }
//! ```
//!
//! Commands: `setup`, `consume`, `stats`, `failed show|retry|remove`, `stop-workers`,
//! `runs submit|show|list|events|cancel|requeue`, `reap`, `demo`, `bench`. Global flags:
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
//! `stop-workers` writes the current time to a stop file next to the configuration
//! (`courier.toml.stop-workers`, or `./courier.stop-workers` with the embedded configuration);
//! every `consume` of that configuration checks it twice a second and stops gracefully, as on
//! SIGTERM, when it holds a time after its own start.

mod app;
mod cli;
mod commands;
mod connect;
mod context;
mod dispatch;
mod error;
mod metrics;
mod raw;
#[cfg(feature = "runs")]
mod runs;
mod table;
mod telemetry;
mod time;
mod wiring;

pub use app::App;
pub use context::EMBEDDED_CONFIG;

/// Runs the `courier` command line with the built-in handlers and agents (the facade's binary).
#[must_use]
pub fn main() -> std::process::ExitCode {
    App::new().run()
}
