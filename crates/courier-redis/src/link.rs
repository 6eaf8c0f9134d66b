//! One Redis connection that reconnects with capped backoff, names itself (`CLIENT SETNAME`)
//! and loads the scripts on every new connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use courier_core::Backoff;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::Mutex;

use crate::scripts::Scripts;

/// The reconnect waits: 50 ms doubling up to 2 s.
pub(crate) const RECONNECT: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

pub(crate) struct Link {
    client: Client,
    config: AsyncConnectionConfig,
    client_name: String,
    scripts: Arc<Scripts>,
    conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    failures: AtomicU32,
}

impl Link {
    pub(crate) fn new(
        client: Client,
        response_timeout: Duration,
        client_name: String,
        scripts: Arc<Scripts>,
    ) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(response_timeout));
        Self {
            client,
            config,
            client_name,
            scripts,
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
            failures: AtomicU32::new(0),
        }
    }

    /// The current connection (its generation and a handle), connecting first if needed.
    /// After a failure, waits the backoff before trying again.
    pub(crate) async fn get(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let mut slot = self.conn.lock().await;
        if let Some((generation, conn)) = &*slot {
            return Ok((*generation, conn.clone()));
        }
        let failures = self.failures.load(Ordering::Relaxed);
        if failures > 0 {
            tokio::time::sleep(backoff(failures)).await;
        }
        match self.connect().await {
            Ok(conn) => {
                self.failures.store(0, Ordering::Relaxed);
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                *slot = Some((generation, conn.clone()));
                Ok((generation, conn))
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let mut pipe = redis::pipe();
        pipe.cmd("CLIENT")
            .arg("SETNAME")
            .arg(&self.client_name)
            .ignore();
        for lua in self.scripts.all() {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source).ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
        Ok(conn)
    }

    /// Drops connection `generation` after an error so the next call reconnects.
    pub(crate) async fn reset(&self, generation: u64) {
        let mut slot = self.conn.lock().await;
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The wait before attempt `failures + 1` (after `failures` >= 1 failures): [`RECONNECT`].
pub(crate) fn backoff(failures: u32) -> Duration {
    RECONNECT.delay(failures.saturating_sub(1))
}

/// Whether a server error (alone or inside a pipeline failure) has this code (`NOGROUP`...).
pub(crate) fn has_code(e: &RedisError, code: &str) -> bool {
    e.code() == Some(code)
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, err)| err.code() == code))
}

/// Whether an error means the connection is gone (reconnect and maybe retry).
pub(crate) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// Whether the server said it cannot serve for now: `LOADING` (a restarted server reading its
/// dataset back), `MASTERDOWN`, `TRYAGAIN`, `CLUSTERDOWN`. The driver's own
/// [`RetryMethod::WaitAndRetry`](redis::RetryMethod::WaitAndRetry): the same command succeeds
/// later, so it is transient, though a new connection does not help at once.
pub(crate) fn is_server_busy(e: &RedisError) -> bool {
    matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> RedisError {
        redis::parse_redis_value(reply)
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn a_server_that_cannot_serve_yet_is_busy_not_broken() {
        for reply in [
            &b"-LOADING Redis is loading the dataset in memory\r\n"[..],
            b"-MASTERDOWN Link with MASTER is down\r\n",
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-CLUSTERDOWN The cluster is down\r\n",
        ] {
            let e = server_error(reply);
            assert!(is_server_busy(&e), "{e}");
            assert!(!is_connection_error(&e), "{e}");
        }
        for reply in [
            &b"-ERR unknown command\r\n"[..],
            b"-NOPERM this user has no permissions\r\n",
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        ] {
            assert!(!is_server_busy(&server_error(reply)), "{reply:?}");
        }
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(5), Duration::from_millis(800));
        assert_eq!(backoff(30), Duration::from_secs(2));
    }
}
