//! `courier dashboard [--listen ADDR] [--token T]`: the web dashboard of `courier-dashboard`
//! over the configuration's transports and run store, until SIGINT/SIGTERM.

use courier_core::CancellationToken;
use courier_dashboard::{Dashboard, DashboardOptions};
use tokio::net::TcpListener;

use super::consume::Signals;
use crate::cli::DashboardArgs;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, chain, remember_secret};
use crate::runs::{open_store, runtime, settings};

pub(crate) async fn run(ctx: &Ctx<'_>, args: &DashboardArgs) -> CliResult {
    let token = args.token.clone().filter(|t| !t.trim().is_empty());
    if token.is_none() && !args.listen.ip().is_loopback() {
        return Err(CliError::usage(format!(
            "--listen {}: serving the dashboard on a non-loopback address needs a token: pass \
             --token TOKEN or set COURIER_DASHBOARD_TOKEN",
            args.listen
        )));
    }
    if let Some(t) = &token {
        remember_secret(t);
    }
    let config = settings(ctx)?;
    let store = open_store(&config).await?;
    let transports = ctx.connect().await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::usage(format!("--listen {}: cannot listen: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::runtime(format!("--listen {}: {e}", args.listen)))?;
    // The run page's actions (signal, resolve, approve, input) go through a runtime with the
    // app's agents, registered on the configuration's bus: a woken run is dispatched there.
    let runtime = runtime(ctx, &config, store.clone());
    let _bus = ctx.bus(&transports, |b| runtime.register(b));
    let mut options = DashboardOptions::default().runtime(runtime);
    #[cfg(feature = "agent")]
    if let Some(streams) = crate::agents::stream_store(ctx)? {
        options = options.streams(std::sync::Arc::new(crate::agents::DashboardStreams(
            streams,
        )));
    }
    #[cfg(feature = "agent")]
    if let Some(breakers) = crate::agents::breaker_store(ctx)? {
        options = options.breakers(std::sync::Arc::new(crate::agents::DashboardBreakers(
            breakers,
        )));
    }
    match token {
        Some(t) => options = options.token(t),
        None => options = options.loopback_hosts(addr.port()),
    }
    let login = if options.token.is_some() {
        " (open it once with ?token=TOKEN)"
    } else {
        ""
    };
    ctx.note(format!(
        "Dashboard on http://{addr}/{login}; Ctrl-C stops it."
    ));
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        Signals::new().next().await;
        on_signal.cancel();
    });
    Dashboard::new(transports, store, options)
        .serve(listener, stop)
        .await
        .map_err(|e| CliError::runtime(chain(&e)))
}
