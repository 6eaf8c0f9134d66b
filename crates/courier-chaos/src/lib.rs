//! Courier's chaos suite: workers SIGKILLed and restarted, servers killed and restarted
//! mid-consume, poison rows written straight into storage, and then a check that nothing was
//! lost, nothing is stuck and nothing ran twice at once.
//!
//! The harness starts its own servers on free loopback ports ([`server`]), never the shared ones,
//! writes a configuration for the `chaos-worker` binary (the `courier` command line plus one
//! message type, [`ChaosItem`], and one agent, [`ChaosAgent`]), produces messages and durable runs
//! ([`scenario`]), and checks what the workers recorded in a SQLite sink that is never killed
//! ([`sink`], [`report`]).
//!
//! Run it with `scripts/chaos` (short) or `scripts/chaos --long` (100,000 messages per transport),
//! or as the ignored test `cargo test -p courier-chaos --test chaos -- --include-ignored`.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use courier_chaos::scenario::{Plan, Target};
//!
//! let worker = std::path::Path::new("target/release/chaos-worker");
//! let report = courier_chaos::scenario::run(Target::Redis, &Plan::short(), worker).await?;
//! println!("{}", report.summary());
//! assert!(report.failures.is_empty(), "{}", report.details());
//! # Ok(()) }
//! ```

pub mod agent;
pub mod hosts;
pub mod keyed;
pub mod outbox;
pub mod poison;
pub mod report;
pub mod scale;
pub mod scenario;
pub mod server;
pub mod sink;
pub mod steps;
mod target;

pub use agent::{ChaosAgent, ChaosItem, ScaleTick};
