//! NATS JetStream: the transport's protocol work with plain async-nats, on a stream and a
//! durable pull consumer of its own (a work-queue stream, explicit acks, the transport's
//! `ack_wait` and `max_ack_pending`): a batch is published with the transport's headers, then
//! all its PubAcks awaited; a claim is one `no_wait` fetch of up to `fetch_size`; each body is
//! decoded, then every `+ACK` sent as a request and all their answers awaited together.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer, stream};
use courier_core::Dsn;
use futures_util::StreamExt;

use super::{Driver, OnHandled, decode};
use crate::error::{RawError, RawResult};

/// The transport's defaults.
const ACK_WAIT: Duration = Duration::from_secs(30);
const MAX_ACK_PENDING: i64 = 10_000;
const TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Raw {
    js: jetstream::Context,
    consumer: consumer::Consumer<consumer::pull::Config>,
    stream: String,
    subject: String,
    headers: HeaderMap,
}

fn err(what: &str, e: impl std::fmt::Display) -> RawError {
    RawError::failed(format!("raw nats benchmark: {what}: {e}"))
}

impl Raw {
    /// Connects to the server of `dsn` (credentials and `?token=` as the transport reads them)
    /// and creates a stream and a consumer of its own.
    pub(super) async fn connect(dsn: &Dsn) -> RawResult<Self> {
        let host = dsn.host().filter(|h| !h.is_empty()).unwrap_or("127.0.0.1");
        let address = format!("{host}:{}", dsn.port().unwrap_or(4222));
        let mut options = async_nats::ConnectOptions::new().request_timeout(Some(TIMEOUT));
        if let (Some(user), Some(password)) = (dsn.user(), dsn.password()) {
            options = options.user_and_password(user.to_owned(), password.to_owned());
        }
        if let Some(token) = dsn.option("token") {
            options = options.token(token.to_owned());
        }
        let client = options
            .connect(address.as_str())
            .await
            .map_err(|e| err("connect", e))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(TIMEOUT)
            .max_ack_inflight(65_536)
            .build(client);
        let stream = format!("courier_raw_bench_{}", fastrand::u32(..));
        let subject = format!("{stream}.messages");
        let created = js
            .create_stream(stream::Config {
                name: stream.clone(),
                subjects: vec![subject.clone()],
                retention: stream::RetentionPolicy::WorkQueue,
                ..stream::Config::default()
            })
            .await
            .map_err(|e| err("create stream", e))?;
        let consumer = created
            .create_consumer(consumer::pull::Config {
                durable_name: Some("courier".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_deliver: -1,
                max_ack_pending: MAX_ACK_PENDING,
                filter_subject: subject.clone(),
                ..consumer::pull::Config::default()
            })
            .await
            .map_err(|e| err("create consumer", e))?;
        let mut headers = HeaderMap::new();
        headers.insert("type", "courier.bench");
        headers.insert("content-type", "application/json");
        Ok(Self {
            js,
            consumer,
            stream,
            subject,
            headers,
        })
    }
}

#[courier_core::async_trait]
impl Driver for Raw {
    async fn send(&self, bodies: &[String]) -> RawResult {
        let mut acks = Vec::with_capacity(bodies.len());
        for body in bodies {
            let ack = self
                .js
                .publish_with_headers(
                    self.subject.clone(),
                    self.headers.clone(),
                    body.clone().into(),
                )
                .await
                .map_err(|e| err("publish", e))?;
            acks.push(ack.into_future());
        }
        for result in futures_util::future::join_all(acks).await {
            result.map_err(|e| err("PubAck", e))?;
        }
        Ok(())
    }

    async fn consume(&self, max: usize, on: OnHandled<'_>) -> RawResult<usize> {
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| err("fetch", e))?;
        let mut got = Vec::with_capacity(max);
        while let Some(message) = batch.next().await {
            got.push(message.map_err(|e| err("fetch", e))?);
        }
        for message in &got {
            on(decode(&message.payload, "nats")?);
        }
        let acks = got.iter().map(|m| m.double_ack());
        for result in futures_util::future::join_all(acks).await {
            result.map_err(|e| err("ack", e))?;
        }
        Ok(got.len())
    }

    async fn cleanup(&self) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}
