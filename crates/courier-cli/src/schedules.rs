//! The `[schedules]` of a configuration as a [`Scheduler`]: the store is the first transport of
//! the configuration, in name order, that offers one (SQL: `<table>_schedules`, Redis: one hash
//! per schedule), so every worker of the configuration agrees on it whatever it consumes. Each
//! tick sends the message (body = the payload as JSON) to the transports `[routing]` names, or
//! submits a durable run of `agent` with `input` (queued like `runs submit`).

use std::sync::Arc;

use courier_core::config::Transports;
use courier_core::schedule::Fire;
use courier_core::{
    BoxError, CONTENT_TYPE_HEADER, Encoded, JSON_CONTENT_TYPE, MessageRegistry, Schedule,
    ScheduleStore, Scheduler, TYPE_HEADER, Transport, async_trait, shared_schedule_store,
};

use crate::error::{CliError, CliResult};

/// The schedule store of the configuration and the transport it lives in.
pub(crate) fn store(transports: &Transports) -> Option<(Arc<dyn ScheduleStore>, String)> {
    transports.all().iter().find_map(|(name, t)| {
        shared_schedule_store(t.clone()).map(|s| (s, format!("transport `{name}`")))
    })
}

/// The run runtime ticks of `agent` schedules submit runs with.
#[cfg(feature = "runs")]
pub(crate) type Runs = courier_runs::Runtime;
/// Without the `runs` feature there is none.
#[cfg(not(feature = "runs"))]
pub(crate) type Runs = std::convert::Infallible;

/// The scheduler of `owner` for the configuration's schedules; `None` when there are none.
/// `runs`: the runtime `agent` schedules submit with; `None` (listing only, or runs not wired)
/// is refused when `firing`.
pub(crate) fn scheduler(
    ctx: &crate::context::Ctx<'_>,
    transports: &Transports,
    owner: &str,
    runs: Option<Runs>,
    firing: bool,
) -> CliResult<Option<Scheduler>> {
    let config = transports.config();
    if config.schedules.is_empty() {
        return Ok(None);
    }
    let Some((store, what)) = store(transports) else {
        return Err(CliError::usage(
            "[schedules] needs a transport that keeps a schedule store (SQL or Redis)",
        ));
    };
    tracing::info!(store = %what, "firing the configured schedules");
    let router = config.router();
    let mut scheduler = Scheduler::new(store, owner);
    for (name, s) in &config.schedules {
        let trigger = s
            .trigger(name)
            .map_err(|e| CliError::usage(e.to_string()))?;
        let missed = s.missed(name).map_err(|e| CliError::usage(e.to_string()))?;
        let schedule = if let Some(agent) = &s.agent {
            submit(ctx, name, agent, s.run_input(), runs.clone(), firing)
                .map(|fire| Schedule::new(name, trigger, fire))?
        } else {
            let message = s.message.clone().unwrap_or_default();
            let targets = router
                .resolve(&message)
                .iter()
                .filter_map(|t| transports.get(t).map(|tr| (t.clone(), tr.clone())))
                .collect();
            let send = SendMessage {
                registry: transports.messages().clone(),
                message,
                body: s.body(),
                targets,
            };
            Schedule::new(name, trigger, send)
        };
        scheduler = scheduler.schedule(schedule.missed(missed));
    }
    Ok(Some(scheduler))
}

/// What an `agent` schedule fires: a run submitted on `runs`, or (listing only) nothing.
fn submit(
    ctx: &crate::context::Ctx<'_>,
    name: &str,
    agent: &str,
    input: serde_json::Value,
    runs: Option<Runs>,
    firing: bool,
) -> CliResult<SubmitRun> {
    #[cfg(feature = "runs")]
    if !ctx.app.agents.contains(agent) {
        return Err(CliError::usage(format!(
            "schedules.{name}.agent: unknown agent `{agent}` (known: {})",
            ctx.app.agents.names()
        )));
    }
    #[cfg(not(feature = "runs"))]
    let _ = ctx;
    if firing && runs.is_none() {
        return Err(CliError::usage(format!(
            "schedules.{name}.agent: runs are not wired (no [runs] table routing `courier.run_agent`)"
        )));
    }
    Ok(SubmitRun {
        runs,
        agent: agent.to_owned(),
        input,
    })
}

/// A tick of an `agent` schedule: a durable run queued.
struct SubmitRun {
    runs: Option<Runs>,
    agent: String,
    input: serde_json::Value,
}

#[async_trait]
impl Fire for SubmitRun {
    async fn fire(&self, _schedule: &str, _tick_ms: i64) -> Result<(), BoxError> {
        let Some(runs) = &self.runs else {
            return Err("runs are not wired".into());
        };
        #[cfg(feature = "runs")]
        {
            runs.enqueue(&self.agent, self.input.clone()).await?;
            Ok(())
        }
        #[cfg(not(feature = "runs"))]
        {
            let _ = (&self.agent, &self.input);
            match *runs {}
        }
    }
}

/// A tick: the message sent to its routed transports.
struct SendMessage {
    registry: Arc<MessageRegistry>,
    message: String,
    body: String,
    targets: Vec<(String, Arc<dyn Transport>)>,
}

#[async_trait]
impl Fire for SendMessage {
    async fn fire(&self, _schedule: &str, _tick_ms: i64) -> Result<(), BoxError> {
        let envelope = self.registry.decode(
            Encoded::new(self.body.clone())
                .header(TYPE_HEADER, self.message.clone())
                .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE),
        );
        for (_, transport) in &self.targets {
            transport.send(envelope.clone()).await?;
        }
        Ok(())
    }
}
