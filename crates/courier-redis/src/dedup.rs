//! Deduplication keys ([`DeduplicateStamp`](courier_core::DeduplicateStamp)) as plain Redis
//! keys `<stream>:dedup:<key>`, taken with `SET key 1 NX PX ttl` (atomic: one of many callers
//! gets `OK`) and expiring by themselves.

use std::time::Duration;

use courier_core::{Deduplicate, TransportError, async_trait};

use crate::RedisTransport;

impl RedisTransport {
    /// The Redis key holding deduplication key `key`.
    #[must_use]
    pub fn dedup_key(&self, key: &str) -> String {
        format!("{}:dedup:{key}", self.options.stream)
    }
}

#[async_trait]
impl Deduplicate for RedisTransport {
    async fn deduplicate(&self, key: &str, ttl: Duration) -> Result<bool, TransportError> {
        let ttl_ms = u64::try_from(ttl.as_millis())
            .unwrap_or(u64::MAX / 4)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.dedup_key(key))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms);
        let (reply,): (Option<String>,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "taking a deduplication key"))?;
        Ok(reply.is_some())
    }

    async fn release(&self, key: &str) -> Result<(), TransportError> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(self.dedup_key(key)).ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "releasing a deduplication key"))
    }
}
