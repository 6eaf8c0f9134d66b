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
//! `runs submit|show|list|events|cancel`, `reap`, `demo`, `bench`. Global flags: `--config FILE`
//! (else `COURIER_CONFIG`, else `./courier.toml`, else [`EMBEDDED_CONFIG`]), `-v`/`-q`,
//! `--format text|json`. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration error.
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
mod raw;
#[cfg(feature = "runs")]
mod runs;
mod table;
mod time;

pub use app::App;
pub use context::EMBEDDED_CONFIG;

/// Runs the `courier` command line with the built-in handlers and agents (the facade's binary).
#[must_use]
pub fn main() -> std::process::ExitCode {
    App::new().run()
}
