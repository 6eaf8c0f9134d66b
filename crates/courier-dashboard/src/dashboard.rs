//! The dashboard itself: its routes over the pages, the API and the assets, behind the guard,
//! and its server.

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use courier_core::CancellationToken;
use courier_core::config::Transports;
use courier_runs::RunStore;
use tokio::net::TcpListener;

use crate::error::DashboardError;
use crate::rates::Rates;
use crate::state::{DashboardOptions, SAMPLE_EVERY, Shared};
use crate::{api, assets, guard, pages, stream};

/// The dashboard of one application (see the [crate docs](crate)).
#[derive(Clone)]
pub struct Dashboard {
    shared: Arc<Shared>,
}

impl fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dashboard")
            .field("transports", &self.shared.transports.all().keys())
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// A dashboard over connected `transports` and a run `store` (set up).
    #[must_use]
    pub fn new(
        transports: Transports,
        store: Arc<dyn RunStore>,
        options: DashboardOptions,
    ) -> Self {
        // Two v4 UUIDs: 244 bits from the operating system's random source.
        let csrf = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Self {
            shared: Arc::new(Shared {
                transports,
                store,
                options,
                csrf,
                rates: Rates::default(),
            }),
        }
    }

    /// The CSRF token every state-changing form must carry (one per process).
    #[must_use]
    pub fn csrf_token(&self) -> &str {
        &self.shared.csrf
    }

    /// The routes: pages, `/api/`, `/assets/`, behind the guard (token, host, security headers).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(pages::overview::page))
            .route("/runs", get(pages::runs::page))
            .route("/runs/{id}", get(pages::run::page))
            .route("/runs/{id}/stream", get(stream::stream))
            .route("/runs/{id}/signal", post(pages::run_actions::signal))
            .route("/runs/{id}/resolve", post(pages::run_actions::resolve))
            .route("/runs/{id}/approve", post(pages::run_actions::approve))
            .route("/runs/{id}/input", post(pages::run_actions::input))
            .route("/failed", get(pages::failed::list))
            .route("/failed/{transport}/{id}", get(pages::failed::detail))
            .route("/failed/retry", post(pages::failed::retry))
            .route("/failed/remove", post(pages::failed::remove))
            .route("/transports/pause", post(pages::pause::pause))
            .route("/transports/resume", post(pages::pause::resume))
            .route("/workers", get(pages::workers::page))
            .route("/api/runs", get(api::runs))
            .route("/api/runs/{id}", get(api::run))
            .route("/api/runs/{id}/events", get(api::events))
            .route("/api/failed", get(api::failed))
            .route("/api/stats", get(api::stats))
            .route("/api/keys", get(api::keys))
            .route("/api/workers", get(api::workers))
            .route("/assets/dashboard.css", get(assets::css))
            .route("/assets/dashboard.js", get(assets::js))
            .route("/favicon.ico", get(assets::favicon))
            .fallback(pages::not_found)
            .layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                guard::guard,
            ))
            .with_state(self.shared.clone())
    }

    /// Serves the dashboard on `listener` until `shutdown` is cancelled, sampling the depth of
    /// every transport every few seconds meanwhile (the rates on the overview).
    ///
    /// # Errors
    /// The listener failed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), DashboardError> {
        let sampler = {
            let shared = self.shared.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                loop {
                    shared.rates.sample(&shared.transports).await;
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(SAMPLE_EVERY) => {}
                    }
                }
            })
        };
        let served = axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        sampler.abort();
        served.map_err(DashboardError::Io)
    }
}
