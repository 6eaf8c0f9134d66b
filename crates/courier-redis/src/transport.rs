//! [`RedisTransport`]: construction, sending, acknowledging.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use courier_core::{
    Capabilities, DelayStamp, DeliveryTagStamp, EncodeError, EncodedJson, Envelope,
    MessageRegistry, Transport, TransportError, TransportErrorKind, TransportMessageIdStamp,
    async_trait,
};
use redis::{Client, IntoConnectionInfo, RedisError, Value};
use tokio::time::Instant;

use crate::RedisOptions;
use crate::in_flight::{InFlight, StreamId};
use crate::link::{Link, has_code, is_connection_error, is_server_busy};
use crate::reader::Reader;
use crate::reply::{self, Entry};
use crate::scripts::Scripts;

/// Ids per `ack` script call (Lua's `unpack` has a limit).
const ACK_CHUNK: usize = 1000;
/// How long a reply may take before the connection is considered dead (a blocking read waits its
/// poll window on top).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts of an operation on the shared connection when the connection breaks.
const ATTEMPTS: u32 = 5;

/// A Redis Streams transport: one stream and consumer group per queue.
///
/// See the crate documentation for the data layout and the delivery guarantees.
pub struct RedisTransport {
    pub(crate) options: RedisOptions,
    pub(crate) delayed_key: String,
    pub(crate) delayed_data_key: String,
    pub(crate) maxlen: String,
    pub(crate) registry: Arc<MessageRegistry>,
    pub(crate) scripts: Arc<Scripts>,
    pub(crate) shared: Link,
    pub(crate) reader: tokio::sync::Mutex<Reader>,
    /// Deliveries handed out and not yet acked. An entry leaves when it is acked, rejected or
    /// retried, when a keepalive finds the delivery no longer ours (another consumer claimed
    /// it), or once it has gone a whole redelivery window without a keepalive (a delivery the
    /// worker let go of: by then anyone may have claimed it).
    pub(crate) in_flight: Mutex<InFlight>,
    /// When `deliver` next drops in-flight entries older than the redelivery window.
    next_prune: Mutex<Instant>,
    pub(crate) due_hint: Mutex<Option<Instant>>,
    /// The delivery tag of every first delivery (count 1, nearly all of them), shared.
    first_delivery: Arc<DeliveryTagStamp>,
    /// The server, redacted, with its database: where the worker registry lives.
    pub(crate) location: String,
    /// Set on a keyed queue (`concurrency_max`, `fair`): messages live in lists per key.
    pub(crate) keyed: Option<crate::keyed::Keyed>,
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How an operation names the delivery it acts on.
struct Delivery<'a> {
    id: &'a str,
    /// `id` parsed; `None` only for an id the server did not write.
    stream_id: Option<StreamId>,
    count: &'a str,
    /// Certainly still ours (see [`RedisTransport::is_fresh`]): acked without a check.
    fresh: bool,
}

fn delivery(envelope: &Envelope) -> Option<Delivery<'_>> {
    let id = envelope.last::<TransportMessageIdStamp>()?.0.as_str();
    if is_delayed_id(id) {
        return None;
    }
    let count = envelope
        .last::<DeliveryTagStamp>()
        .map_or("", |t| t.0.as_str());
    Some(Delivery {
        id,
        stream_id: StreamId::parse(id),
        count,
        fresh: false,
    })
}

pub(crate) fn is_delayed_id(id: &str) -> bool {
    id.starts_with("d-")
}

/// Whether an operation may succeed on a new connection.
pub(crate) fn is_retryable(e: &RedisError) -> bool {
    is_connection_error(e) || has_code(e, "NOSCRIPT")
}

fn delay_ms(delay: Duration) -> u64 {
    u64::try_from(delay.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

impl RedisTransport {
    /// Connects to `url` (`redis://[user:password@]host[:port][/db]`, `rediss://` with the `tls`
    /// feature) and decodes received messages with `registry`.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] for a bad URL, [`TransportErrorKind::Connection`] when the
    /// server cannot be reached.
    pub async fn connect(
        url: &str,
        options: RedisOptions,
        registry: Arc<MessageRegistry>,
    ) -> Result<Self, TransportError> {
        let config_error = |e: RedisError| {
            TransportError::new(TransportErrorKind::Config, options.name.clone())
                .with_context("invalid Redis URL")
                .with_source(e)
        };
        options.check_flow_control().map_err(|reason| {
            TransportError::new(TransportErrorKind::Config, options.name.clone())
                .with_context(reason)
        })?;
        let mut info = url.into_connection_info().map_err(config_error)?;
        if let Some(db) = options.db {
            let settings = info.redis_settings().clone().set_db(db);
            info = info.set_redis_settings(settings);
        }
        let client = Client::open(info).map_err(config_error)?;
        let scripts = Arc::new(Scripts::new());
        // Response timeouts only detect a dead connection. The reader's is the longer one, so a
        // blocking read never moves the runtime's next timer earlier (which costs a wake-up).
        let shared = Link::new(
            client.clone(),
            RESPONSE_TIMEOUT,
            options.consumer.clone(),
            scripts.clone(),
        );
        let reader_link = Link::new(
            client,
            options.poll_window + RESPONSE_TIMEOUT,
            options.consumer.clone(),
            scripts.clone(),
        );
        let transport = Self {
            delayed_key: options.delayed_key(),
            delayed_data_key: options.delayed_data_key(),
            maxlen: options
                .stream_max_entries
                .map_or_else(|| "0".to_owned(), |n| n.to_string()),
            registry,
            scripts,
            shared,
            reader: tokio::sync::Mutex::new(Reader::new(reader_link)),
            in_flight: Mutex::new(InFlight::default()),
            next_prune: Mutex::new(Instant::now()),
            due_hint: Mutex::new(None),
            first_delivery: Arc::new(DeliveryTagStamp("1".to_owned())),
            location: match options.db {
                Some(db) => format!("{}?db={db}", courier_core::redact(url)),
                None => courier_core::redact(url),
            },
            keyed: crate::keyed::Keyed::new(&options),
            options,
        };
        transport
            .shared
            .get()
            .await
            .map_err(|e| transport.error(e, "cannot connect"))?;
        Ok(transport)
    }

    /// The options in effect.
    #[must_use]
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// This transport's consumer name, also the `CLIENT SETNAME` of its connections.
    #[must_use]
    pub fn consumer(&self) -> &str {
        &self.options.consumer
    }

    /// The keys this transport uses: the stream, the delayed set and the delayed data hash.
    #[must_use]
    pub fn keys(&self) -> [&str; 3] {
        [
            &self.options.stream,
            &self.delayed_key,
            &self.delayed_data_key,
        ]
    }

    pub(crate) fn error(&self, e: RedisError, context: &'static str) -> TransportError {
        let kind = if e.is_timeout() {
            TransportErrorKind::Timeout
        } else if is_connection_error(&e) || is_server_busy(&e) {
            TransportErrorKind::Connection
        } else {
            TransportErrorKind::Protocol
        };
        TransportError::new(kind, self.options.name.clone())
            .with_context(context)
            .with_source(e)
    }

    pub(crate) fn in_flight(&self) -> MutexGuard<'_, InFlight> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn encode_error(&self, e: EncodeError) -> TransportError {
        TransportError::new(TransportErrorKind::Encode, self.options.name.clone()).with_source(e)
    }

    /// `XGROUP CREATE stream group 0 MKSTREAM`, accepting an existing group.
    pub(crate) fn create_group_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg("0")
            .arg("MKSTREAM");
        cmd
    }

    pub(crate) async fn create_group(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), RedisError> {
        match self.create_group_cmd().query_async::<()>(conn).await {
            Err(e) if has_code(&e, "BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// Runs a pipeline on the shared connection, reconnecting (with backoff) and retrying when the
    /// connection broke or the server lost the scripts, and recreating a missing group.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisError> {
        let mut attempt = 1;
        let mut group_created = false;
        loop {
            let err = match self.shared.get().await {
                Ok((generation, mut conn)) => match pipe.query_async::<T>(&mut conn).await {
                    Ok(value) => return Ok(value),
                    Err(e) if has_code(&e, "NOGROUP") && !group_created => {
                        group_created = true;
                        self.create_group(&mut conn).await?;
                        continue;
                    }
                    Err(e) => {
                        if is_retryable(&e) {
                            self.shared.reset(generation).await;
                        }
                        e
                    }
                },
                Err(e) => e,
            };
            if attempt >= ATTEMPTS || !is_retryable(&err) {
                return Err(err);
            }
            attempt += 1;
        }
    }

    fn xadd(&self, pipe: &mut redis::Pipeline, encoded: &EncodedJson) {
        // Sized up front: a command's buffer would otherwise grow (and copy) a few times.
        let text = self.options.stream.len() + encoded.body.len() + encoded.headers.len();
        let mut cmd = redis::Cmd::with_capacity(10, text + 48);
        cmd.arg("XADD").arg(&self.options.stream);
        if let Some(n) = self.options.stream_max_entries {
            cmd.arg("MAXLEN").arg("~").arg(n);
        }
        cmd.arg("*")
            .arg("body")
            .arg(&encoded.body)
            .arg("headers")
            .arg(&encoded.headers);
        pipe.add_command(cmd);
    }

    fn send_delayed(
        &self,
        pipe: &mut redis::Pipeline,
        encoded: &EncodedJson,
        delay: Duration,
    ) -> String {
        let id = format!("d-{:032x}", fastrand::u128(..));
        pipe.add_command(
            self.scripts
                .send_delayed
                .cmd(&[
                    &self.options.stream,
                    &self.delayed_key,
                    &self.delayed_data_key,
                ])
                .arg(delay_ms(delay))
                .arg(&id)
                .arg(format!("{}\n{}", encoded.headers, encoded.body))
                .clone(),
        );
        self.hint_due(delay);
        id
    }

    fn hint_due(&self, delay: Duration) {
        let due = Instant::now() + delay;
        let mut hint = self
            .due_hint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if hint.is_none_or(|h| due < h) {
            *hint = Some(due);
        }
    }

    /// Adds envelopes to a pipeline; returns the ids known before sending (`Some` for delayed
    /// entries, `None` where the server assigns the stream id).
    fn add_sends(
        &self,
        pipe: &mut redis::Pipeline,
        envelopes: &[Envelope],
    ) -> Result<Vec<Option<String>>, TransportError> {
        let mut ids = Vec::with_capacity(envelopes.len());
        let capabilities = self.capabilities();
        // One pair of buffers for the batch: each command copies the text it is given.
        let mut encoded = EncodedJson::default();
        for envelope in envelopes {
            capabilities.check_delay(&self.options.name, envelope)?;
            courier_core::encode_json_into_with(envelope, self.options.serializer, &mut encoded)
                .map_err(|e| self.encode_error(e))?;
            match envelope
                .last::<DelayStamp>()
                .map(|d| d.0)
                .filter(|d| !d.is_zero())
            {
                Some(delay) => ids.push(Some(self.send_delayed(pipe, &encoded, delay))),
                None => {
                    self.xadd(pipe, &encoded);
                    ids.push(None);
                }
            }
        }
        Ok(ids)
    }

    /// Whether a delivery is certainly still ours: it is this process's live delivery (same
    /// count) and it was delivered or kept alive less than half the redelivery window ago, so
    /// `XAUTOCLAIM` (which needs the full window of server-side idle time, counted from a moment
    /// after our local timestamp) cannot have handed it to anyone yet.
    fn is_fresh(&self, in_flight: &InFlight, now: Instant, d: &Delivery<'_>) -> bool {
        let entry = d.stream_id.and_then(|id| in_flight.get(&id));
        entry.is_some_and(|(count, at)| {
            d.count.parse() == Ok(*count)
                && now.saturating_duration_since(*at) < self.options.redeliver_timeout / 2
        })
    }

    /// Acks (and deletes) deliveries in one round trip: fresh ones with plain `XACK` + `XDEL`,
    /// the others through the ack script, which checks ownership on the server.
    fn ack_pipeline(&self, deliveries: &mut [Delivery<'_>]) -> redis::Pipeline {
        let now = Instant::now();
        let (mut fresh, mut fresh_bytes) = (0, 0);
        {
            let in_flight = self.in_flight();
            for d in deliveries.iter_mut() {
                d.fresh = self.is_fresh(&in_flight, now, d);
                if d.fresh {
                    fresh += 1;
                    fresh_bytes += d.id.len();
                }
            }
        }
        let mut pipe = redis::Pipeline::with_capacity(3);
        if fresh > 0 {
            let (stream, group) = (&self.options.stream, &self.options.group);
            let mut xack =
                redis::Cmd::with_capacity(3 + fresh, 4 + stream.len() + group.len() + fresh_bytes);
            xack.arg("XACK").arg(stream).arg(group);
            let mut xdel = self.options.delete_after_ack.then(|| {
                let mut xdel = redis::Cmd::with_capacity(2 + fresh, 4 + stream.len() + fresh_bytes);
                xdel.arg("XDEL").arg(stream);
                xdel
            });
            for d in deliveries.iter().filter(|d| d.fresh) {
                xack.arg(d.id);
                if let Some(xdel) = &mut xdel {
                    xdel.arg(d.id);
                }
            }
            pipe.add_command(xack).ignore();
            if let Some(xdel) = xdel {
                pipe.add_command(xdel).ignore();
            }
        }
        let delete = if self.options.delete_after_ack {
            "1"
        } else {
            "0"
        };
        // Rare: deliveries kept past half the redelivery window, or not from this process.
        let checked: Vec<&Delivery<'_>> = deliveries.iter().filter(|d| !d.fresh).collect();
        for chunk in checked.chunks(ACK_CHUNK) {
            let mut cmd = self.scripts.ack.cmd(&[&self.options.stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(delete);
            for d in chunk {
                cmd.arg(d.id).arg(d.count);
            }
            pipe.add_command(cmd).ignore();
        }
        pipe
    }

    async fn remove_deliveries(
        &self,
        envelopes: &[Envelope],
        context: &'static str,
    ) -> Result<(), TransportError> {
        let mut deliveries: Vec<Delivery<'_>> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        self.query::<()>(&self.ack_pipeline(&mut deliveries))
            .await
            .map_err(|e| self.error(e, context))?;
        let mut in_flight = self.in_flight();
        for id in deliveries.iter().filter_map(|d| d.stream_id) {
            in_flight.remove(&id);
        }
        Ok(())
    }

    /// At most once per redelivery window, drops the entries not delivered or kept alive for a
    /// whole window: a worker that still holds one keeps it alive far more often, so such an
    /// entry was let go of (dropped without an ack, or left at shutdown) or claimed by another
    /// consumer, and would otherwise stay in the map (and in the recovery skip list) for good.
    fn prune_stale(&self, in_flight: &mut InFlight, now: Instant) {
        let window = self.options.redeliver_timeout;
        let mut next = self
            .next_prune
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now < *next {
            return;
        }
        *next = now + window;
        in_flight.retain(|_, (_, at)| now.saturating_duration_since(*at) < window);
    }

    /// Turns read entries into envelopes, remembering them as in flight since `requested_at`
    /// (a local time before the request that delivered them).
    pub(crate) fn deliver(&self, entries: Vec<Entry>, requested_at: Instant) -> Vec<Envelope> {
        let mut in_flight = self.in_flight();
        self.prune_stale(&mut in_flight, requested_at);
        let mut decoder = self.registry.json_decoder();
        entries
            .into_iter()
            .map(|e| {
                if let Some(id) = StreamId::parse(&e.id) {
                    in_flight.insert(id, (e.count, requested_at));
                }
                let tag = if e.count == 1 {
                    Arc::clone(&self.first_delivery)
                } else {
                    Arc::new(DeliveryTagStamp(e.count.to_string()))
                };
                decoder
                    .decode_bytes(e.body, e.headers.as_deref())
                    .with(TransportMessageIdStamp(e.id))
                    .with_arc(tag)
            })
            .collect()
    }
}

#[async_trait]
impl Transport for RedisTransport {
    fn messaging_system(&self) -> &'static str {
        "redis"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let mut sent = self.send_batch(vec![envelope]).await?;
        sent.pop().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Protocol, self.options.name.clone())
        })
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if self.keyed.is_some() {
            return self.keyed_read(max).await;
        }
        self.read(max).await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.ack_batch(std::slice::from_ref(envelope)).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self
                .keyed_settle(std::slice::from_ref(envelope), "cannot reject")
                .await;
        }
        self.remove_deliveries(std::slice::from_ref(envelope), "cannot reject")
            .await
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_retry(envelope, delay).await;
        }
        let Some(Delivery {
            id,
            stream_id,
            count,
            ..
        }) = delivery(&envelope)
        else {
            let next = envelope.without_all::<DelayStamp>();
            let next = if delay.is_zero() {
                next
            } else {
                next.with(DelayStamp(delay))
            };
            return self.send(next).await.map(drop);
        };
        let (id, count) = (id.to_owned(), count.to_owned());
        let next = envelope.without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        self.capabilities().check_delay(&self.options.name, &next)?;
        let encoded = courier_core::encode_json_with(&next, self.options.serializer)
            .map_err(|e| self.encode_error(e))?;
        let delayed_id = format!("d-{:032x}", fastrand::u128(..));
        let mut cmd = self.scripts.retry.cmd(&[
            &self.options.stream,
            &self.delayed_key,
            &self.delayed_data_key,
        ]);
        cmd.arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg(&id)
            .arg(&count)
            .arg(if self.options.delete_after_ack {
                "1"
            } else {
                "0"
            })
            .arg(delay_ms(delay))
            .arg(&delayed_id)
            .arg(&encoded.headers)
            .arg(&encoded.body)
            .arg(&self.maxlen);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot retry"))?;
        if !delay.is_zero() {
            self.hint_due(delay);
        }
        if let Some(id) = stream_id {
            self.in_flight().remove(&id);
        }
        Ok(())
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.keepalive_batch(std::slice::from_ref(envelope)).await
    }

    /// Resets the idle time of every delivery that is still this consumer's, in one round trip.
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_keepalive(envelopes).await;
        }
        let deliveries: Vec<Delivery<'_>> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for d in &deliveries {
            let mut cmd = self.scripts.keepalive.cmd(&[&self.options.stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(d.id)
                .arg(d.count);
            pipe.add_command(cmd);
        }
        let requested_at = Instant::now();
        let kept: Vec<u64> = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot keep alive"))?;
        let mut in_flight = self.in_flight();
        for (d, kept) in deliveries.iter().zip(kept) {
            let Some(id) = d.stream_id else { continue };
            let Some(entry) = in_flight.get_mut(&id) else {
                continue;
            };
            if d.count.parse() != Ok(entry.0) {
                continue;
            }
            if kept == 1 {
                entry.1 = requested_at;
            } else {
                // Another consumer claimed it (or it is gone): no longer ours to hold.
                in_flight.remove(&id);
            }
        }
        Ok(())
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        if self.keyed.is_some() {
            return self.keyed_send_batch(envelopes).await;
        }
        let mut pipe = redis::Pipeline::with_capacity(envelopes.len());
        let known = self.add_sends(&mut pipe, &envelopes)?;
        let replies: Vec<Value> = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot send"))?;
        if replies.len() != envelopes.len() {
            return Err(TransportError::new(
                TransportErrorKind::Protocol,
                self.options.name.clone(),
            )
            .with_context("unexpected reply to XADD"));
        }
        envelopes
            .into_iter()
            .zip(known)
            .zip(replies)
            .map(|((envelope, known), reply)| {
                let id = known.or_else(|| reply::into_text(reply)).ok_or_else(|| {
                    TransportError::new(TransportErrorKind::Protocol, self.options.name.clone())
                        .with_context("XADD returned no id")
                })?;
                Ok(envelope.with(TransportMessageIdStamp(id)))
            })
            .collect()
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_settle(envelopes, "cannot ack").await;
        }
        self.remove_deliveries(envelopes, "cannot ack").await
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.listable = Some(self);
        abilities.schedule_store = Some(self);
        abilities.pausable = Some(self);
        abilities.rate_limiter = Some(self);
        abilities.worker_registry = Some(self);
        abilities.message_count = Some(self);
        abilities.deduplicate = Some(self);
        abilities.keyed_queue = self
            .keyed
            .is_some()
            .then_some(self as &dyn courier_core::KeyedQueue);
        abilities.any = Some(self);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_delay(None)
            .with_get_wait(self.options.poll_window)
            .with_redeliver_after(self.options.redeliver_timeout)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use courier_test::TestMessage;

    /// A short redelivery window, so another consumer claims a delivery quickly.
    const WINDOW: Duration = Duration::from_millis(300);
    const OP: Duration = Duration::from_secs(10);

    async fn consumer(stream: &str, name: &str) -> RedisTransport {
        let options = RedisOptions::default()
            .stream(stream)
            .consumer(name)
            .redeliver_timeout(WINDOW)
            .claim_interval(Some(Duration::from_millis(20)))
            .poll_window(Duration::from_millis(100));
        let url = courier_test::env::redis_url();
        tokio::time::timeout(
            OP,
            RedisTransport::connect(&url, options, courier_test::registry()),
        )
        .await
        .unwrap()
        .unwrap()
    }

    async fn get_one(t: &RedisTransport) -> Envelope {
        let deadline = Instant::now() + OP;
        loop {
            let mut got = tokio::time::timeout(OP, t.get(1)).await.unwrap().unwrap();
            if let Some(e) = got.pop() {
                return e;
            }
            assert!(Instant::now() < deadline, "nothing delivered");
        }
    }

    async fn drop_keys(t: &RedisTransport) {
        let client = Client::open(courier_test::env::redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("DEL")
            .arg(&t.options.stream)
            .arg(&t.delayed_key)
            .arg(&t.delayed_data_key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
    async fn a_keepalive_that_finds_a_delivery_claimed_by_another_consumer_forgets_it() {
        let stream = courier_test::env::unique_name("courier_inflight_claimed");
        let (a, b) = (consumer(&stream, "a").await, consumer(&stream, "b").await);
        a.send(Envelope::new(TestMessage::new(1))).await.unwrap();
        let held = get_one(&a).await;
        assert_eq!(a.in_flight().len(), 1);
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        let claimed = get_one(&b).await;
        assert_eq!(
            claimed.message::<TestMessage>().map(|m| m.seq),
            Some(1),
            "b claims a's stale delivery"
        );
        a.keepalive(&held).await.unwrap();
        assert_eq!(a.in_flight().len(), 0, "a no longer holds what b claimed");
        b.ack(&claimed).await.unwrap();
        drop_keys(&a).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
    async fn deliveries_let_go_of_for_a_whole_window_leave_the_in_flight_map() {
        let stream = courier_test::env::unique_name("courier_inflight_stale");
        let (a, b) = (consumer(&stream, "a").await, consumer(&stream, "b").await);
        a.send(Envelope::new(TestMessage::new(1))).await.unwrap();
        let _dropped = get_one(&a).await; // never acked nor kept alive
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        let claimed = get_one(&b).await;
        b.ack(&claimed).await.unwrap();
        a.send(Envelope::new(TestMessage::new(2))).await.unwrap();
        let second = get_one(&a).await;
        assert_eq!(second.message::<TestMessage>().map(|m| m.seq), Some(2));
        assert_eq!(a.in_flight().len(), 1, "only the live delivery is left");
        a.ack(&second).await.unwrap();
        assert_eq!(a.in_flight().len(), 0);
        drop_keys(&a).await;
    }
}
