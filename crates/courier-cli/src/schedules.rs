//! The `[schedules]` of a configuration as a [`Scheduler`]: the store is the first transport of
//! the configuration, in name order, that offers one (SQL: `<table>_schedules`, Redis: one hash
//! per schedule), so every worker of the configuration agrees on it whatever it consumes. Each
//! tick sends the message (body = the payload as JSON) to the transports `[routing]` names.

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

/// The scheduler of `owner` for the configuration's schedules; `None` when there are none.
pub(crate) fn scheduler(transports: &Transports, owner: &str) -> CliResult<Option<Scheduler>> {
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
        let targets = router
            .resolve(&s.message)
            .iter()
            .filter_map(|t| transports.get(t).map(|tr| (t.clone(), tr.clone())))
            .collect();
        let send = SendMessage {
            registry: transports.messages().clone(),
            message: s.message.clone(),
            body: s.body(),
            targets,
        };
        scheduler = scheduler.schedule(Schedule::new(name, trigger, send).missed(missed));
    }
    Ok(Some(scheduler))
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
