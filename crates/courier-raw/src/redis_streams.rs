//! Redis Streams: the transport's commands on a connection of its own; with `symfony+redis://`,
//! the commands of Courier's Symfony transport on Symfony's layout (one `message` field holding
//! JSON `{"body", "headers"}`, wrapped by phpredis's serializer unless `serializer=0`; each read
//! looks for due delayed messages in `<stream>__queue` in the same round trip).

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

/// What Symfony's serializer writes as the headers of a message of type `courier.bench`.
const SYMFONY_HEADERS: &str = r#"{"type":"courier.bench","Content-Type":"application\/json"}"#;

pub(crate) struct Raw {
    client: redis::Client,
    conn: MultiplexedConnection,
    stream: String,
    symfony: Option<Symfony>,
}

/// Symfony's layout, as the DSN's options set it.
struct Symfony {
    /// phpredis's PHP serializer (`serializer=1`, its default).
    php_serialized: bool,
    /// `delete_after_ack` (off by default in Symfony 5.4): `XDEL` beside `XACK`.
    delete: bool,
    /// `<stream>__queue`, the delayed messages.
    queue: String,
}

impl Symfony {
    /// The `message` field of `body`. The benchmark's bodies hold no `/` and nothing beyond
    /// ASCII, so serde_json's string escapes are PHP's.
    fn field(&self, body: &str) -> RawResult<String> {
        let body = serde_json::to_string(body)
            .map_err(|e| RawError::failed(format!("raw symfony benchmark: {e}")))?;
        let json = format!(r#"{{"body":{body},"headers":{SYMFONY_HEADERS}}}"#);
        Ok(if self.php_serialized {
            format!("s:{}:\"{json}\";", json.len())
        } else {
            json
        })
    }

    /// The body of a `message` field.
    fn body(field: &[u8]) -> RawResult<String> {
        #[derive(serde::Deserialize)]
        struct Field {
            body: String,
        }
        let json = match field.strip_prefix(b"s:") {
            Some(rest) => {
                let start = rest.iter().position(|&b| b == b':').map_or(0, |at| at + 2);
                rest.get(start..rest.len().saturating_sub(2))
                    .unwrap_or_default()
            }
            None => field,
        };
        let field: Field = serde_json::from_slice(json)
            .map_err(|e| RawError::failed(format!("raw symfony benchmark: bad field: {e}")))?;
        Ok(field.body)
    }
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
        read.arg("STREAMS").arg(&self.stream).arg(">");
        let reply: Value = match &self.symfony {
            None => read.query_async(conn).await.map_err(err)?,
            Some(symfony) => {
                // The due delayed messages (none here), looked for in the same round trip.
                let mut pipe = redis::pipe();
                pipe.cmd("ZRANGEBYSCORE")
                    .arg(&symfony.queue)
                    .arg("-inf")
                    .arg(now_ms())
                    .arg("LIMIT")
                    .arg(0)
                    .arg(1000)
                    .ignore();
                pipe.add_command(read);
                let (reply,): (Value,) = pipe.query_async(conn).await.map_err(err)?;
                reply
            }
        };
        let field = if self.symfony.is_some() {
            "message"
        } else {
            "body"
        };
        let entries = entries(&reply, field.as_bytes());
        if entries.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(entries.len());
        for (id, body) in &entries {
            if self.symfony.is_some() {
                on(decode(Symfony::body(body)?.as_bytes(), "symfony redis")?);
            } else {
                on(decode(body, "redis")?);
            }
            ids.push(*id);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(&ids)
            .ignore();
        if self.symfony.as_ref().is_none_or(|s| s.delete) {
            pipe.cmd("XDEL").arg(&self.stream).arg(&ids).ignore();
        }
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
        Self::connect_to(dsn.expose_without_query(), None).await
    }

    /// The raw loop on Symfony's layout (`symfony+redis://host:port/...`), on a stream of its
    /// own, with the DSN's `serializer` and `delete_after_ack`.
    pub(super) async fn symfony(dsn: &Dsn) -> RawResult<Self> {
        let exposed = dsn.expose_without_query();
        let server = exposed.strip_prefix("symfony+").unwrap_or(exposed);
        // `redis://[auth@]host:port`, without Symfony's `/stream/group/consumer` path.
        let authority_end = server
            .find("://")
            .and_then(|at| server[at + 3..].find('/').map(|end| at + 3 + end))
            .unwrap_or(server.len());
        let symfony = Symfony {
            php_serialized: dsn.option("serializer") != Some("0"),
            delete: dsn.option("delete_after_ack") == Some("true"),
            queue: String::new(),
        };
        let mut raw = Self::connect_to(&server[..authority_end], Some(symfony)).await?;
        if let Some(symfony) = &mut raw.symfony {
            symfony.queue = format!("{}__queue", raw.stream);
        }
        Ok(raw)
    }

    async fn connect_to(url: &str, symfony: Option<Symfony>) -> RawResult<Self> {
        let client = redis::Client::open(url).map_err(err)?;
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
            symfony,
        })
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The entry ids and `field` values of an `XREADGROUP` reply for one stream.
fn entries<'a>(reply: &'a Value, field: &[u8]) -> Vec<(&'a [u8], &'a [u8])> {
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
                [Value::BulkString(k), Value::BulkString(v)] if k == field => Some(v.as_slice()),
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
            match &self.symfony {
                None => pipe
                    .cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("body")
                    .arg(body)
                    .arg("headers")
                    .arg(HEADERS)
                    .ignore(),
                Some(symfony) => pipe
                    .cmd("XADD")
                    .arg(&self.stream)
                    .arg("*")
                    .arg("message")
                    .arg(symfony.field(body)?)
                    .ignore(),
            };
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
