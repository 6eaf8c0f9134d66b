//! The schedule store on Redis: one hash per schedule, `<group>:schedule:<name>`, with the
//! lease (`owner`, `until` from the server's `TIME`) and the last fired tick (`last`) together.
//! A claim (take when free, expired or ours; renew) and a tick (recorded only by the live holder
//! and only forward) are each one Lua script, so two workers never fire the same tick. The hash
//! has no TTL: the last tick outlives every lease. Pausing (`courier pause`): the key
//! `<stream>:paused` exists while the stream's queue is paused.

use std::time::Duration;

use courier_core::schedule::{Held, ScheduleState};
use courier_core::{ScheduleStore, TransportError, async_trait};

use crate::RedisTransport;

#[async_trait]
impl ScheduleStore for RedisTransport {
    async fn claim(
        &self,
        schedule: &str,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Held>, TransportError> {
        let key = self.options.schedule_key(schedule);
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .schedule_claim
                .cmd(&[&key])
                .arg(owner)
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX / 4))
                .clone(),
        );
        let ((held, last),): ((i64, String),) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot claim a schedule's lease"))?;
        Ok((held == 1).then(|| Held::new(last.parse().ok())))
    }

    async fn advance(
        &self,
        schedule: &str,
        owner: &str,
        tick_ms: i64,
    ) -> Result<bool, TransportError> {
        let key = self.options.schedule_key(schedule);
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .schedule_advance
                .cmd(&[&key])
                .arg(owner)
                .arg(tick_ms)
                .clone(),
        );
        let (done,): (i64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot record a schedule's tick"))?;
        Ok(done == 1)
    }

    async fn state(&self, schedule: &str) -> Result<Option<ScheduleState>, TransportError> {
        let key = self.options.schedule_key(schedule);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&key)
            .arg("owner")
            .arg("until")
            .arg("last");
        let ((owner, until, last),): ((Option<String>, Option<i64>, Option<i64>),) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot read a schedule"))?;
        Ok(owner.map(|o| ScheduleState::new(Some(o), until.unwrap_or(0), last)))
    }

    fn location(&self) -> Option<String> {
        Some(format!(
            "{}#{}:schedule:*",
            self.location, self.options.group
        ))
    }
}

/// Pausing on Redis: the key `<stream>:paused` exists while the stream's queue is paused.
#[async_trait]
impl courier_core::Pausable for RedisTransport {
    async fn set_paused(&self, paused: bool) -> Result<bool, TransportError> {
        let key = format!("{}:paused", self.options.stream);
        let mut pipe = redis::pipe();
        if paused {
            pipe.cmd("SET").arg(&key).arg(1).arg("NX");
            let (set,): (Option<String>,) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot pause the queue"))?;
            Ok(set.is_some())
        } else {
            pipe.cmd("DEL").arg(&key);
            let (gone,): (i64,) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot resume the queue"))?;
            Ok(gone == 1)
        }
    }

    async fn is_paused(&self) -> Result<bool, TransportError> {
        let key = format!("{}:paused", self.options.stream);
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(&key);
        let (n,): (i64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot read the pause flag"))?;
        Ok(n == 1)
    }
}
