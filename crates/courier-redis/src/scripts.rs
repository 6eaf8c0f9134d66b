//! The Lua scripts: every multi-step change is one atomic server-side call.

use redis::Script;

/// A script with its source, run with `EVALSHA` (loaded on every new connection).
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: Script::new(source).get_hash().to_owned(),
        }
    }

    /// `EVALSHA sha numkeys keys...` with the arguments still to add.
    pub(crate) fn cmd(&self, keys: &[&str]) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len()).arg(keys);
        cmd
    }
}

/// All scripts of the transport.
pub(crate) struct Scripts {
    pub(crate) ack: Lua,
    pub(crate) keepalive: Lua,
    pub(crate) send_delayed: Lua,
    pub(crate) promote: Lua,
    pub(crate) retry: Lua,
    pub(crate) claim: Lua,
    pub(crate) recover: Lua,
    pub(crate) count: Lua,
    pub(crate) worker_register: Lua,
    pub(crate) worker_heartbeat: Lua,
    pub(crate) worker_list: Lua,
    pub(crate) worker_stop: Lua,
    pub(crate) schedule_claim: Lua,
    pub(crate) schedule_advance: Lua,
    pub(crate) limit_take: Lua,
    pub(crate) keyed_send: Lua,
    pub(crate) keyed_claim: Lua,
    pub(crate) keyed_ack: Lua,
    pub(crate) keyed_keepalive: Lua,
    pub(crate) keyed_retry: Lua,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            ack: Lua::new(concat!(
                include_str!("lua/owned.lua"),
                include_str!("lua/ack.lua")
            )),
            keepalive: Lua::new(concat!(
                include_str!("lua/owned.lua"),
                include_str!("lua/keepalive.lua")
            )),
            send_delayed: Lua::new(concat!(
                include_str!("lua/delay.lua"),
                include_str!("lua/send_delayed.lua")
            )),
            promote: Lua::new(concat!(
                include_str!("lua/delay.lua"),
                include_str!("lua/promote.lua")
            )),
            retry: Lua::new(concat!(
                include_str!("lua/owned.lua"),
                include_str!("lua/delay.lua"),
                include_str!("lua/retry.lua")
            )),
            claim: Lua::new(include_str!("lua/claim.lua")),
            recover: Lua::new(include_str!("lua/recover.lua")),
            count: Lua::new(include_str!("lua/count.lua")),
            worker_register: Lua::new(concat!(
                include_str!("lua/workers.lua"),
                include_str!("lua/worker_register.lua")
            )),
            worker_heartbeat: Lua::new(concat!(
                include_str!("lua/workers.lua"),
                include_str!("lua/worker_heartbeat.lua")
            )),
            worker_list: Lua::new(concat!(
                include_str!("lua/workers.lua"),
                include_str!("lua/worker_list.lua")
            )),
            worker_stop: Lua::new(concat!(
                include_str!("lua/workers.lua"),
                include_str!("lua/worker_stop.lua")
            )),
            schedule_claim: Lua::new(concat!(
                include_str!("lua/schedules.lua"),
                include_str!("lua/schedule_claim.lua")
            )),
            schedule_advance: Lua::new(concat!(
                include_str!("lua/schedules.lua"),
                include_str!("lua/schedule_advance.lua")
            )),
            limit_take: Lua::new(include_str!("lua/limit_take.lua")),
            keyed_send: Lua::new(concat!(
                include_str!("lua/keyed.lua"),
                include_str!("lua/keyed_send.lua")
            )),
            keyed_claim: Lua::new(concat!(
                include_str!("lua/keyed.lua"),
                include_str!("lua/keyed_claim.lua")
            )),
            keyed_ack: Lua::new(concat!(
                include_str!("lua/keyed.lua"),
                include_str!("lua/keyed_ack.lua")
            )),
            keyed_keepalive: Lua::new(concat!(
                include_str!("lua/keyed.lua"),
                include_str!("lua/keyed_keepalive.lua")
            )),
            keyed_retry: Lua::new(concat!(
                include_str!("lua/keyed.lua"),
                include_str!("lua/keyed_retry.lua")
            )),
        }
    }

    pub(crate) fn all(&self) -> [&Lua; 20] {
        [
            &self.ack,
            &self.keepalive,
            &self.send_delayed,
            &self.promote,
            &self.retry,
            &self.claim,
            &self.recover,
            &self.count,
            &self.worker_register,
            &self.worker_heartbeat,
            &self.worker_list,
            &self.worker_stop,
            &self.schedule_claim,
            &self.schedule_advance,
            &self.limit_take,
            &self.keyed_send,
            &self.keyed_claim,
            &self.keyed_ack,
            &self.keyed_keepalive,
            &self.keyed_retry,
        ]
    }
}
