//! Redis Streams: the transport's commands on a connection of its own.

use std::time::Duration;

use courier_core::Dsn;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::task::JoinHandle;

use super::{Driver, OnHandled, decode};
use crate::error::{RawError, RawResult};

const HEADERS: &str = r#"{"content-type":"application/json","type":"courier.bench"}"#;
const GROUP: &str = "courier";

/// How long the latency floor's `XREADGROUP` blocks (the transport's poll window).
const BLOCK: Duration = Duration::from_secs(1);

pub(crate) struct Raw {
    client: redis::Client,
    conn: MultiplexedConnection,
    stream: String,
}

fn err(e: redis::RedisError) -> RawError {
    RawError::failed(format!("raw redis benchmark: {e}"))
}

impl Raw {
    /// `XREADGROUP COUNT max [BLOCK block]` on `conn`; decodes each body, then one pipelined
    /// `XACK` + `XDEL` (on `conn` too) with every id.
    async fn read(
        &self,
        conn: &mut MultiplexedConnection,
        max: usize,
        block: Option<Duration>,
        on: OnHandled<'_>,
    ) -> RawResult<usize> {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(GROUP)
            .arg("raw")
            .arg("COUNT")
            .arg(max);
        if let Some(block) = block {
            read.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        let reply: Value = read
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(conn)
            .await
            .map_err(err)?;
        let entries = entries(&reply);
        if entries.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(entries.len());
        for (id, body) in &entries {
            on(decode(body, "redis")?);
            ids.push(*id);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(&ids)
            .ignore();
        pipe.cmd("XDEL").arg(&self.stream).arg(&ids).ignore();
        pipe.query_async::<()>(conn).await.map_err(err)?;
        Ok(entries.len())
    }

    /// The latency floor's consumer: `XREADGROUP ... BLOCK` on a connection of its own (sends
    /// go on the other one), acks on it too.
    pub(super) async fn block(
        self: &std::sync::Arc<Self>,
        fetch_size: usize,
        handled: super::Handled,
    ) -> RawResult<JoinHandle<()>> {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(BLOCK * 5));
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(err)?;
        let raw = self.clone();
        Ok(tokio::spawn(async move {
            let on = move |seq: u64| {
                super::report_handled(&handled, seq);
            };
            loop {
                if let Err(e) = raw.read(&mut conn, fetch_size, Some(BLOCK), &on).await {
                    tracing::warn!(error = %e, "raw redis latency consumer failed");
                    return;
                }
            }
        }))
    }

    pub(super) async fn connect(dsn: &Dsn) -> RawResult<Self> {
        let client = redis::Client::open(dsn.expose_without_query()).map_err(err)?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(err)?;
        let stream = format!("courier_raw_bench_{}", fastrand::u32(..));
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        Ok(Self {
            client,
            conn,
            stream,
        })
    }
}

/// The entry ids and bodies of an `XREADGROUP` reply for one stream.
fn entries(reply: &Value) -> Vec<(&[u8], &[u8])> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let Some(Value::Array(stream)) = streams.first() else {
        return Vec::new();
    };
    let Some(Value::Array(entries)) = stream.get(1) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let Value::Array(parts) = e else { return None };
            let (Some(Value::BulkString(id)), Some(Value::Array(fields))) =
                (parts.first(), parts.get(1))
            else {
                return None;
            };
            let body = fields.chunks(2).find_map(|kv| match kv {
                [Value::BulkString(k), Value::BulkString(v)] if k == b"body" => Some(v.as_slice()),
                _ => None,
            })?;
            Some((id.as_slice(), body))
        })
        .collect()
}

#[courier_core::async_trait]
impl Driver for Raw {
    async fn send(&self, bodies: &[String]) -> RawResult {
        let mut pipe = redis::pipe();
        for body in bodies {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("body")
                .arg(body)
                .arg("headers")
                .arg(HEADERS)
                .ignore();
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await.map_err(err)
    }

    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize> {
        self.read(&mut self.conn.clone(), max, None, on).await
    }

    async fn cleanup(&self) {
        let mut conn = self.conn.clone();
        let _: Result<(), _> = redis::cmd("DEL")
            .arg(&self.stream)
            .query_async(&mut conn)
            .await;
    }
}

/// Deletes these keys (what the Courier side of the benchmark created) on a connection of its
/// own; failures are ignored.
pub async fn delete(dsn: &Dsn, keys: &[&str]) {
    let Ok(client) = redis::Client::open(dsn.expose_without_query()) else {
        return;
    };
    if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
        let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
    }
}
