//! The dashboard's state: what it shows (transports, run store, worker registry) and how it
//! guards itself (token, allowed hosts, CSRF token).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use courier_core::config::Transports;
use courier_core::{Listable, WorkerRegistry};
use courier_runs::{RunStore, Runtime};

use crate::error::DashboardError;
use crate::rates::Rates;

/// How often [`Dashboard::serve`] samples the depth of every transport (for the rates).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// How the dashboard guards itself and pages its lists.
#[derive(Clone, Default)]
pub struct DashboardOptions {
    /// Every request must carry this token (`Authorization: Bearer`, or the cookie set by
    /// opening a page with `?token=`). Required by the CLI when binding to a non-loopback
    /// address.
    pub token: Option<String>,
    /// When set, only requests whose `Host` header is one of these are served (the CLI sets
    /// the loopback names of its port when it has no token, so a page on another site cannot
    /// reach the dashboard through DNS rebinding).
    pub allowed_hosts: Option<Vec<String>>,
    /// Runs per page (default 50).
    pub page_size: Option<usize>,
    /// The worker registry to show (default: the first transport that has one).
    pub worker_registry: Option<Arc<dyn WorkerRegistry>>,
    /// The runtime the run page's actions go through (send a run its signal, resolve a parked
    /// step, approve, give input): registered on a built bus, so that a woken or released run
    /// is dispatched, and with the application's agents, which an approved run resumes with.
    /// Without one the run page shows no actions.
    pub runtime: Option<Runtime>,
    /// The LLM agents' circuit breakers, shown on the workers page (the CLI gives the run
    /// store's when an `[agents.NAME]` table has a `breaker`).
    pub breakers: Option<Arc<dyn BreakerSource>>,
    /// The runs' token streams, served at `GET /runs/ID/stream` (the CLI gives the run store's
    /// when an agent streams).
    pub streams: Option<Arc<dyn StreamSource>>,
}

/// One event of a run's token stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEventView {
    /// Its offset in the run's stream (the SSE `id`).
    pub offset: i64,
    /// `chunk`, `retry` or `done` (the SSE `event`).
    pub kind: String,
    /// Its text.
    pub data: String,
}

/// Where the dashboard reads runs' token streams from (the application adapts its store).
#[courier_core::async_trait]
pub trait StreamSource: Send + Sync + 'static {
    /// The unexpired events of run `run` after offset `after`, at most `limit`, in order.
    ///
    /// # Errors
    /// The store failed.
    async fn read(
        &self,
        run: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<StreamEventView>, String>;
}

/// One provider's circuit breaker, as the workers page shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BreakerView {
    /// The provider.
    pub provider: String,
    /// `closed`, `open` or `half_open`.
    pub state: String,
    /// Failures in its current window.
    pub failures: u32,
    /// When it last opened, epoch ms (0: never).
    pub opened_at_ms: i64,
}

/// Where the dashboard reads circuit breakers from (the dashboard does not depend on the agent
/// crate: the application adapts its breaker store).
#[courier_core::async_trait]
pub trait BreakerSource: Send + Sync + 'static {
    /// Every breaker, by provider.
    ///
    /// # Errors
    /// The store failed; the text is shown on the page.
    async fn breakers(&self) -> Result<Vec<BreakerView>, String>;
}

impl fmt::Debug for DashboardOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardOptions")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("page_size", &self.page_size)
            .field("worker_registry", &self.worker_registry.is_some())
            .field("runtime", &self.runtime.is_some())
            .field("breakers", &self.breakers.is_some())
            .field("streams", &self.streams.is_some())
            .finish()
    }
}

impl DashboardOptions {
    /// Requires `token` on every request.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Serves only requests for the loopback names of `port` (`127.0.0.1`, `localhost`,
    /// `[::1]`).
    #[must_use]
    pub fn loopback_hosts(mut self, port: u16) -> Self {
        self.allowed_hosts = Some(
            ["127.0.0.1", "localhost", "[::1]"]
                .iter()
                .flat_map(|h| [format!("{h}:{port}"), (*h).to_owned()])
                .collect(),
        );
        self
    }

    /// Shows `registry` on the workers page.
    #[must_use]
    pub fn worker_registry(mut self, registry: Arc<dyn WorkerRegistry>) -> Self {
        self.worker_registry = Some(registry);
        self
    }

    /// Acts on runs through `runtime` (see [`DashboardOptions::runtime`](Self#structfield.runtime)).
    #[must_use]
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Serves the token streams of `source` at `GET /runs/ID/stream`.
    #[must_use]
    pub fn streams(mut self, source: Arc<dyn StreamSource>) -> Self {
        self.streams = Some(source);
        self
    }

    /// Shows the circuit breakers of `source` on the workers page.
    #[must_use]
    pub fn breakers(mut self, source: Arc<dyn BreakerSource>) -> Self {
        self.breakers = Some(source);
        self
    }
}

/// What every handler reads.
pub(crate) struct Shared {
    pub(crate) transports: Transports,
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) options: DashboardOptions,
    /// The per-process CSRF token every form carries.
    pub(crate) csrf: String,
    pub(crate) rates: Rates,
}

impl Shared {
    /// The worker registry: the configured one, else the first transport's.
    pub(crate) fn registry(&self) -> Option<&dyn WorkerRegistry> {
        if let Some(r) = &self.options.worker_registry {
            return Some(r.as_ref());
        }
        self.transports
            .all()
            .values()
            .find_map(|t| t.as_worker_registry())
    }

    /// The failure transports of the configuration.
    pub(crate) fn failure_names(&self) -> Vec<String> {
        self.transports.config().failure_transport_names()
    }

    /// The failure transport `name`, listable.
    pub(crate) fn listable(&self, name: &str) -> Result<&dyn Listable, DashboardError> {
        if !self.failure_names().iter().any(|n| n == name) {
            return Err(DashboardError::NotFound(format!(
                "no failure transport `{name}`"
            )));
        }
        self.transports
            .get(name)
            .and_then(|t| t.as_listable())
            .ok_or_else(|| {
                DashboardError::BadRequest(format!(
                    "transport `{name}` cannot list its messages (use a SQL or Redis transport as \
                     the failure transport to browse it)"
                ))
            })
    }

    pub(crate) fn page_size(&self) -> usize {
        self.options.page_size.unwrap_or(50).clamp(1, 500)
    }
}
