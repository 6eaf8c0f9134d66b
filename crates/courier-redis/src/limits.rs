//! Rate-limit buckets on Redis (`rate_limit` on a transport): the key `<stream>:limit` holds the
//! bucket's theoretical arrival time (epoch microseconds of the server's `TIME`; see
//! [`RateLimit`]), taken from by one Lua script, so workers on any host never race. The key
//! expires once the bucket is full again (an absent key is a full bucket).

use courier_core::{RateLimit, RateLimiter, Taken, TransportError, async_trait};

use crate::RedisTransport;

/// How long the key outlives the moment its bucket is full again, in ms.
const LINGER_MS: u64 = 1_000;

impl RedisTransport {
    /// The Redis key of this stream's rate-limit bucket.
    #[must_use]
    pub fn limit_key(&self) -> String {
        format!("{}:limit", self.options.stream)
    }
}

#[async_trait]
impl RateLimiter for RedisTransport {
    async fn take(&self, limit: &RateLimit, want: u32) -> Result<Taken, TransportError> {
        let key = self.limit_key();
        let mut pipe = redis::pipe();
        pipe.add_command(
            self.scripts
                .limit_take
                .cmd(&[&key])
                .arg(limit.emission_us())
                .arg(limit.tolerance_us())
                .arg(want)
                .arg(LINGER_MS)
                .clone(),
        );
        let ((tat, granted, now),): ((String, i64, String),) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot take rate-limit tokens"))?;
        let us = |s: &str| s.parse::<i64>().unwrap_or(0);
        Ok(limit.taken(us(&tat), us(&now), granted))
    }
}
