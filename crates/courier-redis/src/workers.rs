//! The worker registry on Redis: the hash `<group>:workers` (field = worker id, value = its
//! record as JSON, times from the server's `TIME`) and the set `<group>:workers:stop` of the ids
//! asked to stop. Each operation is one Lua script (or one atomic pipeline), so pruning, stop
//! requests and heartbeats never lose each other's writes: a heartbeat rewrites the record but
//! never the stop set.

use std::time::Duration;

use courier_core::{Heartbeat, TransportError, WorkerRecord, WorkerRegistry, async_trait};
use serde::{Deserialize, Serialize};

use crate::RedisTransport;

/// What a worker sends: its record without the times (the script adds them).
#[derive(Serialize)]
struct Sent<'a> {
    id: &'a str,
    host: &'a str,
    pid: u32,
    version: &'a str,
    transports: &'a [String],
    handled: u64,
    failed: u64,
}

/// A stored record.
#[derive(Deserialize)]
struct Stored {
    id: String,
    host: String,
    pid: u32,
    version: String,
    #[serde(default)]
    transports: Vec<String>,
    #[serde(default)]
    handled: u64,
    #[serde(default)]
    failed: u64,
    started_at_ms: i64,
    last_heartbeat_ms: i64,
}

fn sent(w: &WorkerRecord) -> String {
    serde_json::to_string(&Sent {
        id: &w.id,
        host: &w.host,
        pid: w.pid,
        version: &w.version,
        transports: &w.transports,
        handled: w.handled,
        failed: w.failed,
    })
    .unwrap_or_else(|_| "{}".to_owned())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4)
}

impl RedisTransport {
    fn worker_keys(&self) -> [String; 2] {
        let hash = self.options.workers_key();
        let stop = format!("{hash}:stop");
        [hash, stop]
    }
}

#[async_trait]
impl WorkerRegistry for RedisTransport {
    async fn register(&self, w: &WorkerRecord) -> Result<(), TransportError> {
        let [hash, stop] = self.worker_keys();
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .worker_register
                .cmd(&[&hash, &stop])
                .arg(&w.id)
                .arg(sent(w))
                .clone(),
        );
        let (_,): (i64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot register the worker"))?;
        Ok(())
    }

    async fn heartbeat(&self, w: &WorkerRecord) -> Result<Heartbeat, TransportError> {
        let [hash, stop] = self.worker_keys();
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .worker_heartbeat
                .cmd(&[&hash, &stop])
                .arg(&w.id)
                .arg(sent(w))
                .clone(),
        );
        let ((stop, again),): ((i64, i64),) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot record a worker heartbeat"))?;
        Ok(Heartbeat::new(stop != 0, again != 0))
    }

    async fn unregister(&self, id: &str) -> Result<(), TransportError> {
        let [hash, stop] = self.worker_keys();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("HDEL")
            .arg(&hash)
            .arg(id)
            .ignore()
            .cmd("SREM")
            .arg(&stop)
            .arg(id)
            .ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot unregister the worker"))
    }

    async fn list(&self) -> Result<Vec<WorkerRecord>, TransportError> {
        let [hash, stop] = self.worker_keys();
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .worker_list
                .cmd(&[&hash, &stop])
                .arg(ms(self.options.worker_stale_after))
                .clone(),
        );
        let (flat,): (Vec<redis::Value>,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot list the workers"))?;
        let mut out = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [json, flag] = pair else { continue };
            let Ok(json) = redis::from_redis_value_ref::<String>(json) else {
                continue;
            };
            let Ok(s) = serde_json::from_str::<Stored>(&json) else {
                tracing::debug!(courier.transport = %self.options.name, "skipping a worker record that does not decode");
                continue;
            };
            let mut r = WorkerRecord::new(s.id, s.host, s.pid, s.transports);
            r.version = s.version;
            r.started_at_ms = s.started_at_ms;
            r.last_heartbeat_ms = s.last_heartbeat_ms;
            r.handled = s.handled;
            r.failed = s.failed;
            r.stop_requested = redis::from_redis_value_ref::<i64>(flag).is_ok_and(|f| f != 0);
            out.push(r);
        }
        out.sort_by(|a, b| a.started_at_ms.cmp(&b.started_at_ms).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    async fn request_stop(&self, id: Option<&str>) -> Result<u64, TransportError> {
        let [hash, stop] = self.worker_keys();
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .worker_stop
                .cmd(&[&hash, &stop])
                .arg(ms(self.options.worker_stale_after))
                .arg(id.unwrap_or(""))
                .clone(),
        );
        let (asked,): (u64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot ask the workers to stop"))?;
        Ok(asked)
    }

    fn stale_after(&self) -> Duration {
        self.options.worker_stale_after
    }

    fn location(&self) -> Option<String> {
        Some(format!("{}#{}", self.location, self.options.workers_key()))
    }
}
