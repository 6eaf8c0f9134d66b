//! Courier's web dashboard: an [axum](https://docs.rs/axum) [`Router`](axum::Router) over an
//! application's transports, its run store and its worker registry, rendered on the server
//! (maud templates, one stylesheet, a few lines of vanilla JavaScript for confirmations).
//!
//! Pages: the overview (transports with depth and rate, runs by status, workers alive), runs
//! (filtered by status and agent, keyset-paginated, found by id), a run (status, lease, owner,
//! requeues, termination reason, the event timeline, the step journal, budget and pending wait,
//! and, with [`DashboardOptions::runtime`], its actions: signal, resolve a parked step, approve,
//! input), failed messages (error, stamps, body as
//! text; retry or remove one or all, after a confirmation) and workers. `/api/` serves the same
//! data as JSON in the shapes of the CLI's `--format json`: `/api/runs`, `/api/runs/{id}`,
//! `/api/runs/{id}/events`, `/api/failed`, `/api/stats`, `/api/keys`, `/api/workers`.
//!
//! Security (see [`DashboardOptions`]): with a token, every request must carry it (an
//! `Authorization: Bearer` header, or the cookie set by opening any page with `?token=`);
//! without one, only requests whose `Host` is a loopback name are served (no DNS rebinding).
//! GET never changes state; every POST carries the per-process CSRF token in a hidden field.
//! Every value from the store or a message is escaped (maud escapes by default), and the
//! Content-Security-Policy allows only the dashboard's own script and stylesheet.
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::config::Config;
//! use courier_core::{MessageRegistry, TransportRegistry};
//! use courier_dashboard::{Dashboard, DashboardOptions};
//! use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config: Config = std::fs::read_to_string("courier.toml")?.parse()?;
//! let transports = config
//!     .connect(&TransportRegistry::new(), Arc::new(MessageRegistry::new()))
//!     .await?;
//! let store = SqlRunStore::connect("sqlite://courier.db", SqlRunStoreOptions::default()).await?;
//! store.setup().await?;
//! let dashboard = Dashboard::new(transports, Arc::new(store), DashboardOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! dashboard.serve(listener, Default::default()).await?;
//! # Ok(()) }
//! ```

mod api;
mod assets;
mod dashboard;
mod error;
mod guard;
mod pages;
mod rates;
mod state;
mod stream;

pub use dashboard::Dashboard;
pub use error::DashboardError;
pub use state::{BreakerSource, BreakerView, DashboardOptions, StreamEventView, StreamSource};
