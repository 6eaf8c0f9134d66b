//! The `[schedules]` of a configuration as a [`Scheduler`]: the store is the first transport of
//! the configuration, in name order, that offers one (SQL: `<table>_schedules`, Redis: one hash
//! per schedule), so every worker of the configuration agrees on it whatever it consumes. Each
//! tick dispatches the message (body = the payload as JSON) on the worker's bus to the
//! transports `[routing]` names, or submits a durable run of `agent` with `input` (queued like
//! `runs submit`).
//!
//! A tick goes through the bus like any dispatch: signed when its type is, with a message id,
//! trace context and the send metrics. The scheduler fires a tick at least once (it records the
//! tick only once it fired, and fires it again when the fire failed or its holder died first), so
//! each tick is made idempotent on its schedule and time:
//!
//! - its message id is the same on every attempt: a UUID version 7 whose timestamp is the tick
//!   (epoch ms) and whose other bits come from the schedule's name, so an inbox drops a repeat;
//! - it is dispatched to each routed transport separately with a [`DeduplicateStamp`] keyed
//!   `schedule:<name>:<tick ms>:<transport>`, taken on that transport's deduplication store
//!   (SQL `<table>_dedup`, Redis `SET NX`) for as long as the tick can be fired again, so a
//!   repeat is dropped before it is sent, and a transport that took the tick is not sent it
//!   again when another one failed. A transport without a deduplication store (RabbitMQ, NATS,
//!   `sync://`) gets the tick at least once (logged at start);
//! - an `agent` tick enqueues its run with the unique key `schedule:<name>:<tick ms>`.

use std::sync::Arc;
use std::time::Duration;

use courier_core::config::Transports;
use courier_core::schedule::{DEFAULT_SCHEDULE_LEASE, Fire};
use courier_core::{
    BoxError, CONTENT_TYPE_HEADER, DeduplicateStamp, DeduplicatedStamp, Encoded, JSON_CONTENT_TYPE,
    MessageBus, MessageIdStamp, MessageRegistry, Missed, Schedule, ScheduleStore, Scheduler,
    TYPE_HEADER, TransportNamesStamp, Trigger, async_trait, shared_schedule_store,
};
use tracing::Instrument;

use crate::error::{CliError, CliResult};

/// The longest deduplication or unique key the stores take (SQL: a 190-character column).
const MAX_KEY_BYTES: usize = 190;

/// How much longer than a tick can be fired again its deduplication key is kept: room for the
/// clocks of the hosts and a slow poll.
const KEY_MARGIN: Duration = Duration::from_secs(60);

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
/// `bus`: the bus message ticks are dispatched on (the worker's), `None` when only listing
/// them. `runs`: the runtime `agent` schedules submit with; `None` (listing only, or runs not
/// wired) is refused when firing.
pub(crate) fn scheduler(
    ctx: &crate::context::Ctx<'_>,
    transports: &Transports,
    owner: &str,
    runs: Option<Runs>,
    bus: Option<MessageBus>,
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
    let firing = bus.is_some();
    if firing {
        tracing::info!(store = %what, "firing the configured schedules");
    }
    let router = config.router();
    let mut scheduler = Scheduler::new(store, owner);
    for (name, s) in &config.schedules {
        let trigger = s
            .trigger(name)
            .map_err(|e| CliError::usage(e.to_string()))?;
        let missed = s.missed(name).map_err(|e| CliError::usage(e.to_string()))?;
        let tick = TickKeys {
            schedule: name.clone(),
            trigger: trigger.clone(),
            missed,
        };
        let schedule = if let Some(agent) = &s.agent {
            tick.check_key_len(None)?;
            submit(ctx, name, agent, s.run_input(), runs.clone(), firing, tick)
                .map(|fire| Schedule::new(name, trigger, fire))?
        } else {
            let message = s.message.clone().unwrap_or_default();
            let mut targets = Vec::new();
            for target in router.resolve(&message) {
                let Some(transport) = transports.get(target) else {
                    continue;
                };
                let dedup = transport.as_deduplicate().is_some();
                if dedup {
                    tick.check_key_len(Some(target))?;
                } else if firing {
                    tracing::info!(courier.schedule = %name, messaging.destination.name = %target,
                        "this transport keeps no deduplication keys: a tick fired again (its worker died between sending and recording it) reaches it twice, with the same message id");
                }
                targets.push(Target {
                    name: target.clone(),
                    dedup,
                });
            }
            let send = SendMessage {
                bus: bus.clone(),
                registry: transports.messages().clone(),
                message,
                body: s.body(),
                targets,
                tick,
            };
            Schedule::new(name, trigger, send)
        };
        scheduler = scheduler.schedule(schedule.missed(missed));
    }
    Ok(Some(scheduler))
}

/// What makes one tick of a schedule recognisable on every attempt: its message id, its
/// deduplication keys and how long they are kept.
#[derive(Clone)]
struct TickKeys {
    schedule: String,
    trigger: Trigger,
    missed: Missed,
}

impl TickKeys {
    /// The tick's message id: a UUID version 7 whose timestamp is the tick and whose other bits
    /// are a hash (FNV-1a, stable across builds and hosts) of the schedule's name.
    fn message_id(&self, tick_ms: i64) -> MessageIdStamp {
        let hash = fnv1a_128(self.schedule.as_bytes()).to_be_bytes();
        let mut rest = [0_u8; 10];
        rest.copy_from_slice(&hash[..10]);
        let millis = u64::try_from(tick_ms).unwrap_or(0);
        MessageIdStamp(
            uuid::Builder::from_unix_timestamp_millis(millis, &rest)
                .into_uuid()
                .to_string(),
        )
    }

    /// The tick's key: `schedule:<name>:<tick ms>`, then `:<transport>` for a send.
    fn key(&self, tick_ms: i64, transport: Option<&str>) -> String {
        match transport {
            Some(t) => format!("schedule:{}:{tick_ms}:{t}", self.schedule),
            None => format!("schedule:{}:{tick_ms}", self.schedule),
        }
    }

    /// Refuses a schedule (or transport) name whose keys the stores would not take.
    fn check_key_len(&self, transport: Option<&str>) -> CliResult {
        // The widest tick: 13 digits until the year 2286, one more for the sign to be safe.
        let widest = self.key(-9_999_999_999_999, transport);
        if widest.len() > MAX_KEY_BYTES {
            return Err(CliError::usage(format!(
                "schedules.{}: the schedule's name{} is too long for its ticks' deduplication keys ({} bytes, at most {MAX_KEY_BYTES})",
                self.schedule,
                transport.map_or(String::new(), |t| format!(" with transport `{t}`")),
                widest.len()
            )));
        }
        Ok(())
    }

    /// How long a tick's key is kept: as long as a holder may fire the tick again (while fewer
    /// than the missed policy's bound of ticks came after it, and for `skip` at most a lease),
    /// plus a margin.
    fn ttl(&self, tick_ms: i64) -> Duration {
        let keep = match self.missed {
            Missed::CatchUp(n) => n.max(1),
            _ => 1,
        };
        let mut at = tick_ms;
        for _ in 0..keep {
            match self.trigger.next_after(at) {
                Some(next) => at = next,
                None => break,
            }
        }
        let owed = Duration::from_millis(u64::try_from(at - tick_ms).unwrap_or(0));
        owed.max(DEFAULT_SCHEDULE_LEASE) + KEY_MARGIN
    }
}

/// 128-bit FNV-1a.
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME))
}

/// What an `agent` schedule fires: a run submitted on `runs`, or (listing only) nothing.
fn submit(
    ctx: &crate::context::Ctx<'_>,
    name: &str,
    agent: &str,
    input: serde_json::Value,
    runs: Option<Runs>,
    firing: bool,
    tick: TickKeys,
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
        tick,
    })
}

/// A tick of an `agent` schedule: a durable run queued, once per tick (a unique key).
struct SubmitRun {
    runs: Option<Runs>,
    agent: String,
    input: serde_json::Value,
    tick: TickKeys,
}

#[async_trait]
impl Fire for SubmitRun {
    async fn fire(&self, _schedule: &str, tick_ms: i64) -> Result<(), BoxError> {
        let Some(runs) = &self.runs else {
            return Err("runs are not wired".into());
        };
        #[cfg(feature = "runs")]
        {
            let unique =
                courier_runs::UniqueKey::new(self.tick.key(tick_ms, None), self.tick.ttl(tick_ms))?;
            let enqueued = runs
                .enqueue_unique(&self.agent, self.input.clone(), unique)
                .await?;
            if let courier_runs::Enqueued::Duplicate(run) = enqueued {
                tracing::debug!(courier.schedule = %self.tick.schedule, tick_ms, courier.run.id = %run,
                    "the tick's run was queued already");
            }
            Ok(())
        }
        #[cfg(not(feature = "runs"))]
        {
            let _ = (&self.agent, &self.input, &self.tick, tick_ms);
            match *runs {}
        }
    }
}

/// A transport a message tick is sent to, and whether it deduplicates.
struct Target {
    name: String,
    dedup: bool,
}

/// A tick: the message dispatched on the bus to each routed transport.
struct SendMessage {
    /// `None` when only listing.
    bus: Option<MessageBus>,
    registry: Arc<MessageRegistry>,
    message: String,
    body: String,
    targets: Vec<Target>,
    tick: TickKeys,
}

impl SendMessage {
    async fn send(&self, bus: &MessageBus, tick_ms: i64) -> Result<(), BoxError> {
        let id = self.tick.message_id(tick_ms);
        for target in &self.targets {
            let mut envelope = self
                .registry
                .decode(
                    Encoded::new(self.body.clone())
                        .header(TYPE_HEADER, self.message.clone())
                        .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE),
                )
                .with(id.clone())
                .with(TransportNamesStamp(vec![target.name.clone()]));
            if target.dedup {
                envelope = envelope.with(DeduplicateStamp::new(
                    self.tick.key(tick_ms, Some(&target.name)),
                    self.tick.ttl(tick_ms),
                ));
            }
            let sent = bus.dispatch(envelope).await?;
            if sent.has::<DeduplicatedStamp>() {
                tracing::debug!(courier.schedule = %self.tick.schedule, tick_ms,
                    messaging.destination.name = %target.name, "the tick was sent already");
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Fire for SendMessage {
    async fn fire(&self, schedule: &str, tick_ms: i64) -> Result<(), BoxError> {
        let Some(bus) = &self.bus else {
            return Err("schedules are only listed here, not fired".into());
        };
        let span = tracing::info_span!("schedule", courier.schedule = schedule, tick_ms);
        self.send(bus, tick_ms).instrument(span).await
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use courier_core::TransportRegistry;
    use courier_core::config::Config;

    /// Two SQLite transports in one file, `a` (set up) and `b` (its table made only when
    /// `setup_b`), both receiving `test.tick`.
    async fn transports(dir: &std::path::Path) -> Transports {
        let db = dir.join("courier.db");
        let db = db.to_str().unwrap();
        let config: Config = format!(
            "[transports.a]\ndsn = \"sqlite://{db}\"\n\n\
             [transports.b]\ndsn = \"sqlite://{db}?table_name=b_messages&auto_setup=false\"\n\n\
             [routing]\n\"test.tick\" = [\"a\", \"b\"]\n"
        )
        .parse()
        .unwrap();
        let factories = TransportRegistry::new().with(Arc::new(courier_sql::SqlTransportFactory));
        let transports = config
            .connect(&factories, Arc::new(MessageRegistry::new()))
            .await
            .unwrap();
        let a = transports.get("a").unwrap();
        a.as_setup().unwrap().setup().await.unwrap();
        transports
    }

    fn send(transports: &Transports) -> SendMessage {
        let targets = ["a", "b"]
            .map(|name| Target {
                name: name.to_owned(),
                dedup: transports.get(name).unwrap().as_deduplicate().is_some(),
            })
            .into();
        SendMessage {
            bus: Some(transports.bus_builder().build()),
            registry: transports.messages().clone(),
            message: "test.tick".to_owned(),
            body: "{\"n\":1}".to_owned(),
            targets,
            tick: TickKeys {
                schedule: "tick".to_owned(),
                trigger: Trigger::every(Duration::from_secs(1)).unwrap(),
                missed: Missed::CatchUp(10),
            },
        }
    }

    /// The message ids of what transport `name` holds.
    async fn ids(transports: &Transports, name: &str) -> Vec<String> {
        let listed = transports
            .get(name)
            .unwrap()
            .as_listable()
            .unwrap()
            .list(100)
            .await
            .unwrap();
        let mut ids: Vec<String> = listed
            .iter()
            .map(|e| e.last::<MessageIdStamp>().expect("a message id").0.clone())
            .collect();
        ids.sort();
        ids
    }

    #[tokio::test]
    async fn a_tick_fired_again_is_sent_once_to_each_transport_with_its_own_message_id() {
        let dir = tempfile::tempdir().unwrap();
        let transports = transports(dir.path()).await;
        let send = send(&transports);
        let tick = 1_800_000_000_000;
        // `b` has no table yet: the tick reaches `a` and fails on `b`.
        assert!(send.fire("tick", tick).await.is_err(), "b cannot take it");
        assert_eq!(ids(&transports, "a").await.len(), 1);
        let b = transports.get("b").unwrap();
        b.as_setup().unwrap().setup().await.unwrap();
        // Fired again (the scheduler did not record it): `a` has it already, `b` gets it.
        send.fire("tick", tick).await.unwrap();
        send.fire("tick", tick).await.unwrap();
        send.fire("tick", tick + 1_000).await.unwrap();
        let expected = vec![
            send.tick.message_id(tick).0,
            send.tick.message_id(tick + 1_000).0,
        ];
        assert_eq!(ids(&transports, "a").await, expected, "each tick once on a");
        assert_eq!(ids(&transports, "b").await, expected, "each tick once on b");
    }

    #[test]
    fn a_ticks_message_id_is_a_uuid_v7_of_its_time_and_schedule() {
        let keys = |schedule: &str| TickKeys {
            schedule: schedule.to_owned(),
            trigger: Trigger::every(Duration::from_secs(1)).unwrap(),
            missed: Missed::Skip,
        };
        let id = keys("report").message_id(1_800_000_000_000).0;
        let uuid = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos), (1_800_000_000, 0));
        assert_eq!(id, keys("report").message_id(1_800_000_000_000).0);
        assert_ne!(id, keys("other").message_id(1_800_000_000_000).0);
        assert_ne!(id, keys("report").message_id(1_800_000_001_000).0);
    }

    #[test]
    fn a_ticks_key_is_kept_while_the_tick_can_be_fired_again() {
        let every = |missed| TickKeys {
            schedule: "s".to_owned(),
            trigger: Trigger::every(Duration::from_secs(60)).unwrap(),
            missed,
        };
        assert_eq!(
            every(Missed::Skip).ttl(0),
            Duration::from_secs(60) + KEY_MARGIN
        );
        assert_eq!(
            every(Missed::CatchUp(10)).ttl(0),
            Duration::from_secs(600) + KEY_MARGIN
        );
        let long = TickKeys {
            schedule: "x".repeat(200),
            ..every(Missed::Skip)
        };
        let err = long.check_key_len(None).unwrap_err().to_string();
        assert!(
            err.contains("too long") && err.contains("schedules.xxx"),
            "{err}"
        );
    }
}
