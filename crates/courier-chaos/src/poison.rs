//! Poison written straight into storage with the raw drivers (every kind each transport can
//! hold), and the raw read of the failure transport that must hold exactly that poison.
//!
//! Every poison body carries a marker, `chaos-poison-<kind>`, so it can be recognised in the
//! failure transport even when its headers are gone; the SQLite integer body is `4242`.

use anyhow::Context;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use sqlx::Connection;

use crate::target::Target;

/// One injected poison message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poison {
    /// What is wrong with it (`non-utf8-body`, `unknown-type`, ...).
    pub kind: &'static str,
    /// What its body contains, to find it in the failure transport.
    pub marker: String,
}

/// A message read raw from the failure storage.
#[derive(Debug, Clone)]
pub struct FailedRow {
    /// The storage id (row id, stream entry id).
    pub id: String,
    /// The body bytes.
    pub body: Vec<u8>,
    /// The headers as stored (a JSON object).
    pub headers: String,
}

impl FailedRow {
    /// The poison this row is, if any.
    #[must_use]
    pub fn poison<'p>(&self, poison: &'p [Poison]) -> Option<&'p Poison> {
        let body = String::from_utf8_lossy(&self.original_body()).into_owned();
        poison.iter().find(|p| {
            if p.kind == "integer-body" {
                body.trim() == p.marker
            } else {
                body.contains(&p.marker)
            }
        })
    }

    /// The body as first stored: a body kept as base64 under `x-courier-body-encoding: base64`
    /// (Courier's wire form for a body that is not UTF-8) is decoded.
    #[must_use]
    pub fn original_body(&self) -> Vec<u8> {
        let base64 = serde_json::from_str::<serde_json::Value>(&self.headers)
            .ok()
            .and_then(|h| {
                h.get("x-courier-body-encoding")
                    .and_then(|v| v.as_str())
                    .map(|v| v == "base64")
            })
            .unwrap_or(false);
        if base64 && let Some(decoded) = base64_decode(&self.body) {
            return decoded;
        }
        self.body.clone()
    }

    /// A short description for the report: id, `type` header, and the chaos id or body prefix.
    #[must_use]
    pub fn describe(&self) -> String {
        let ty = serde_json::from_str::<serde_json::Value>(&self.headers)
            .ok()
            .and_then(|h| h.get("type").and_then(|t| t.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "?".into());
        let body = String::from_utf8_lossy(&self.body);
        let prefix: String = body.chars().take(60).collect();
        format!("row {} type={ty} body={prefix:?}", self.id)
    }
}

struct Raw {
    kind: &'static str,
    body: Body,
    headers: Option<String>,
}

enum Body {
    Text(String),
    Bytes(Vec<u8>),
    Integer(i64),
}

fn marker(kind: &str) -> String {
    format!("chaos-poison-{kind}")
}

fn typed(ty: &str) -> Option<String> {
    Some(format!(
        r#"{{"type":"{ty}","content-type":"application/json"}}"#
    ))
}

/// The poison a transport can store.
fn kinds(target: Target) -> Vec<Raw> {
    let json =
        |kind: &'static str| Body::Text(format!(r#"{{"id":1,"marker":"{}"}}"#, marker(kind)));
    let mut out = vec![
        Raw {
            kind: "unknown-type",
            body: json("unknown-type"),
            headers: typed("chaos.unknown"),
        },
        Raw {
            kind: "bad-json",
            body: Body::Text(format!(r#"{{"id": {} "#, marker("bad-json"))),
            headers: typed("chaos.item"),
        },
        Raw {
            kind: "wrong-shape",
            body: Body::Text(format!(r#"{{"id":"{}"}}"#, marker("wrong-shape"))),
            headers: typed("chaos.item"),
        },
        Raw {
            kind: "missing-headers",
            body: json("missing-headers"),
            headers: None,
        },
    ];
    // RabbitMQ and NATS carry headers as a table, not as one JSON text.
    if !matches!(target, Target::Rabbitmq | Target::Nats) {
        out.push(Raw {
            kind: "headers-not-json",
            body: json("headers-not-json"),
            headers: Some("not json".into()),
        });
    }
    if target != Target::Postgres {
        let mut bytes = vec![0xff, 0xfe, b' '];
        bytes.extend_from_slice(marker("non-utf8-body").as_bytes());
        bytes.extend_from_slice(&[b' ', 0xc3, 0x28]);
        out.push(Raw {
            kind: "non-utf8-body",
            body: Body::Bytes(bytes),
            headers: typed("chaos.item"),
        });
    }
    if target == Target::Sqlite {
        out.push(Raw {
            kind: "integer-body",
            body: Body::Integer(4242),
            headers: typed("chaos.item"),
        });
    }
    out
}

impl Raw {
    fn poison(&self) -> Poison {
        Poison {
            kind: self.kind,
            marker: match self.body {
                Body::Integer(i) => i.to_string(),
                _ => marker(self.kind),
            },
        }
    }
}

/// Where the poison goes and where the failure transport lives.
#[derive(Debug, Clone)]
pub enum Storage {
    /// A SQL table (`courier_messages`), queue `default` for messages, `failed` for failures.
    Sql {
        /// The sqlx URL.
        url: String,
    },
    /// A Redis stream.
    Redis {
        /// The server.
        url: String,
        /// The stream key.
        stream: String,
    },
    /// A NATS JetStream subject (poison only: the failure transport is SQLite).
    Nats {
        /// The server.
        url: String,
        /// The subject the transport's stream captures.
        subject: String,
    },
    /// A RabbitMQ queue (poison only: the failure transport is SQLite).
    Amqp {
        /// The server.
        url: String,
        /// The queue.
        queue: String,
    },
}

const SQL_INSERT: &str = "INSERT INTO courier_messages (queue_name, body, headers, priority, created_at, available_at) VALUES ('default', ?, ?, 0, ?, ?)";

/// Writes every poison `target` can hold into `storage`. Returns what was written and, for
/// each kind the storage refused, the reason.
///
/// # Errors
/// A connection failure.
pub async fn inject(
    target: Target,
    storage: &Storage,
) -> anyhow::Result<(Vec<Poison>, Vec<String>)> {
    let mut written = Vec::new();
    let mut refused = Vec::new();
    let now = crate::sink::now_ms();
    match storage {
        Storage::Sql { url } => {
            let pg = url.starts_with("postgres");
            let insert = if pg {
                SQL_INSERT.replace("?, ?, 0, ?, ?", "$1, $2, 0, $3, $4")
            } else {
                SQL_INSERT.to_owned()
            };
            let mut conn = sqlx::AnyConnection::connect(url)
                .await
                .context("poison: connect")?;
            for raw in kinds(target) {
                let headers = raw.headers.clone().unwrap_or_else(|| "{}".into());
                let q = sqlx::query(&insert);
                let q = match &raw.body {
                    Body::Text(t) => q.bind(t.clone()),
                    Body::Bytes(b) => q.bind(b.clone()),
                    Body::Integer(i) => q.bind(*i),
                };
                match q.bind(headers).bind(now).bind(now).execute(&mut conn).await {
                    Ok(_) => written.push(raw.poison()),
                    Err(e) => refused.push(format!("{}: {e}", raw.kind)),
                }
            }
        }
        Storage::Redis { url, stream } => {
            let client = redis::Client::open(url.as_str())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            for raw in kinds(target) {
                let mut cmd = redis::cmd("XADD");
                cmd.arg(stream).arg("*");
                match &raw.body {
                    Body::Text(t) => cmd.arg("body").arg(t.as_bytes()),
                    Body::Bytes(b) => cmd.arg("body").arg(b.as_slice()),
                    Body::Integer(i) => cmd.arg("body").arg(*i),
                };
                if let Some(h) = &raw.headers {
                    cmd.arg("headers").arg(h);
                }
                match cmd.query_async::<String>(&mut c).await {
                    Ok(_) => written.push(raw.poison()),
                    Err(e) => refused.push(format!("{}: {e}", raw.kind)),
                }
            }
        }
        Storage::Amqp { url, queue } => {
            let conn =
                lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            for raw in kinds(target) {
                let mut table = FieldTable::default();
                let mut props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_message_id(ShortString::from(uuid::Uuid::new_v4().to_string()));
                if let Some(h) = &raw.headers {
                    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(h)?;
                    for (k, v) in map {
                        let v = v.as_str().unwrap_or_default().to_owned();
                        if k == "content-type" {
                            props = props.with_content_type(ShortString::from(v));
                        } else {
                            table.insert(
                                ShortString::from(k),
                                AMQPValue::LongString(LongString::from(v)),
                            );
                        }
                    }
                    props = props.with_headers(table);
                }
                let body = match &raw.body {
                    Body::Text(t) => t.clone().into_bytes(),
                    Body::Bytes(b) => b.clone(),
                    Body::Integer(i) => i.to_string().into_bytes(),
                };
                let confirm = ch
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        props,
                    )
                    .await?
                    .await?;
                if confirm.is_ack() {
                    written.push(raw.poison());
                } else {
                    refused.push(format!("{}: not confirmed", raw.kind));
                }
            }
            let _ = conn.close(200, "done".into()).await;
        }
        Storage::Nats { url, subject } => {
            let js = nats_connect(url).await?;
            for raw in kinds(target) {
                let mut headers = async_nats::HeaderMap::new();
                if let Some(h) = &raw.headers {
                    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(h)?;
                    for (k, v) in map {
                        headers.insert(k.as_str(), v.as_str().unwrap_or_default());
                    }
                }
                let body = match &raw.body {
                    Body::Text(t) => t.clone().into_bytes(),
                    Body::Bytes(b) => b.clone(),
                    Body::Integer(i) => i.to_string().into_bytes(),
                };
                let stored = match js
                    .publish_with_headers(subject.clone(), headers, body.into())
                    .await
                {
                    Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match stored {
                    Ok(()) => written.push(raw.poison()),
                    Err(e) => refused.push(format!("{}: {e}", raw.kind)),
                }
            }
        }
    }
    Ok((written, refused))
}

/// A JetStream context on the server of a `nats://host:port` URL.
async fn nats_connect(url: &str) -> anyhow::Result<async_nats::jetstream::Context> {
    let address = url.trim_start_matches("nats://").trim_end_matches('/');
    let client = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        async_nats::connect(address),
    )
    .await
    .context("poison: nats connect timed out")??;
    Ok(async_nats::jetstream::new(client))
}

/// The messages still stored in a NATS stream (a work queue keeps exactly those not acked or
/// rejected, delayed ones included).
///
/// # Errors
/// A connection failure, or no such stream.
pub async fn nats_stored(url: &str, stream: &str) -> anyhow::Result<i64> {
    let js = nats_connect(url).await?;
    let mut stream = js.get_stream(stream).await?;
    let info = stream.info().await?;
    Ok(i64::try_from(info.state.messages).unwrap_or(i64::MAX))
}

/// Reads the failure storage raw: the `failed` queue of a SQL table, or a Redis stream.
///
/// # Errors
/// A connection or query failure.
pub async fn failed_rows(storage: &Storage) -> anyhow::Result<Vec<FailedRow>> {
    match storage {
        Storage::Sql { url } => {
            let cast = if url.starts_with("postgres") {
                "convert_to(body, 'UTF8')"
            } else if url.starts_with("mysql") {
                "CAST(body AS BINARY)"
            } else {
                "CAST(body AS BLOB)"
            };
            let id = if url.starts_with("mysql") {
                "CAST(id AS CHAR)"
            } else {
                "CAST(id AS TEXT)"
            };
            let headers = cast.replace("body", "headers");
            let sql = format!(
                "SELECT {id}, {cast}, {headers} FROM courier_messages WHERE queue_name = 'failed' ORDER BY id"
            );
            let mut conn = sqlx::AnyConnection::connect(url).await?;
            let rows: Vec<(String, Vec<u8>, Vec<u8>)> =
                sqlx::query_as(&sql).fetch_all(&mut conn).await?;
            Ok(rows
                .into_iter()
                .map(|(id, body, headers)| FailedRow {
                    id,
                    body,
                    headers: String::from_utf8_lossy(&headers).into_owned(),
                })
                .collect())
        }
        Storage::Redis { url, stream } => {
            let client = redis::Client::open(url.as_str())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            let reply: redis::Value = redis::cmd("XRANGE")
                .arg(stream)
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await?;
            let mut out = Vec::new();
            let redis::Value::Array(entries) = reply else {
                return Ok(out);
            };
            for entry in entries {
                let redis::Value::Array(parts) = entry else {
                    continue;
                };
                let (Some(redis::Value::BulkString(id)), Some(redis::Value::Array(fields))) =
                    (parts.first(), parts.get(1))
                else {
                    continue;
                };
                let mut row = FailedRow {
                    id: String::from_utf8_lossy(id).into_owned(),
                    body: Vec::new(),
                    headers: String::new(),
                };
                for pair in fields.chunks(2) {
                    if let [redis::Value::BulkString(k), redis::Value::BulkString(v)] = pair {
                        match k.as_slice() {
                            b"body" => row.body.clone_from(v),
                            b"headers" => row.headers = String::from_utf8_lossy(v).into_owned(),
                            _ => {}
                        }
                    }
                }
                out.push(row);
            }
            Ok(out)
        }
        Storage::Amqp { .. } => anyhow::bail!("an AMQP queue is not listable"),
        Storage::Nats { .. } => anyhow::bail!("a NATS stream is not listable here"),
    }
}

/// Installs the sqlx `Any` drivers (idempotent).
pub fn install_drivers() {
    sqlx::any::install_default_drivers();
}

/// Standard base64 (with or without padding, whitespace ignored); `None` on a foreign character.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let compact: Vec<u8> = text
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::Engine::decode(&LENIENT, compact).ok()
}
