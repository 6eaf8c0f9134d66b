//! Where the workers of a configuration register ([`WorkerRegistry`]): the stores its
//! transports offer (a SQL table, a Redis hash), else the run store when it is SQL (a
//! RabbitMQ-only configuration), else none (then `stop-workers` falls back to the stop file,
//! which reaches only workers on the same file system).

use std::sync::Arc;

use courier_core::config::Transports;
use courier_core::{WorkerRegistry, shared_worker_registry};

use crate::context::Ctx;

/// A registry and what it is, for logs (`transport async`, `the run store`).
pub(crate) struct Found {
    pub(crate) registry: Arc<dyn WorkerRegistry>,
    pub(crate) what: String,
}

/// The registry a `consume` of `consumed` registers in: the first transport (in name order)
/// among those it consumes that has one, else the first of the configuration, else the run
/// store's database when it is SQL.
pub(crate) async fn for_consume(
    ctx: &Ctx<'_>,
    transports: &Transports,
    consumed: &[String],
) -> Option<Found> {
    let of = |name: &String| {
        let transport = transports.get(name)?.clone();
        shared_worker_registry(transport).map(|registry| Found {
            registry,
            what: format!("transport `{name}`"),
        })
    };
    if let Some(found) = consumed.iter().find_map(of) {
        return Some(found);
    }
    if let Some(found) = transports.all().keys().find_map(of) {
        return Some(found);
    }
    run_store(ctx).await
}

/// Every distinct registry of the configuration (two transports on one table share one), for
/// `courier workers` and `courier stop-workers`; the run store's when no transport has one.
pub(crate) async fn all(ctx: &Ctx<'_>, transports: &Transports) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (name, transport) in transports.all() {
        let Some(registry) = shared_worker_registry(transport.clone()) else {
            continue;
        };
        if let Some(location) = registry.location() {
            if seen.contains(&location) {
                continue;
            }
            seen.push(location);
        }
        found.push(Found {
            registry,
            what: format!("transport `{name}`"),
        });
    }
    if found.is_empty() {
        found.extend(run_store(ctx).await);
    }
    found
}

/// The worker registry in the run store's database, when runs are wired and the store is SQL.
#[cfg(all(feature = "runs", feature = "sql"))]
async fn run_store(ctx: &Ctx<'_>) -> Option<Found> {
    if !crate::runs::enabled(ctx) {
        return None;
    }
    let config = crate::runs::settings(ctx).ok()?;
    let dsn = crate::runs::store_dsn(config.store.as_deref());
    let parsed = courier_core::Dsn::parse(&dsn).ok()?;
    match courier_sql::SqlTransport::connect_worker_registry("runs", &parsed).await {
        Ok(registry) => Some(Found {
            registry,
            what: "the run store".to_owned(),
        }),
        Err(e) => {
            tracing::warn!(store = %courier_core::redact(&dsn), error = %crate::error::chain(&e),
                "cannot open the worker registry in the run store");
            None
        }
    }
}

#[cfg(not(all(feature = "runs", feature = "sql")))]
async fn run_store(_ctx: &Ctx<'_>) -> Option<Found> {
    None
}
