//! A keyed queue's operations on the transport (see `keyed.rs` for the queue and
//! `lua/keyed.lua` for the layout): send, claim, settle, retry, keep alive, count.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use courier_core::{
    ConcurrencyKeyStamp, DelayStamp, DeliveryTagStamp, EncodedJson, Envelope, KeyLoad, KeyLoads,
    KeyedQueue, Transport, TransportError, TransportErrorKind, TransportMessageIdStamp,
};
use redis::Value;
use tokio::time::Instant;

use crate::RedisTransport;
use crate::keyed::Keyed;
use crate::link::backoff;
use crate::reply;
use crate::transport::is_retryable;

/// Messages per send script call.
const SEND_CHUNK: usize = 500;

/// A delivery of a keyed queue, as its scripts name it.
struct Delivery<'a> {
    id: &'a str,
    /// The concurrency key whose slot it holds.
    key: &'a str,
    /// Its member of the leases set: id, newline, delivery tag (`count, newline, key`).
    lease: String,
}

/// The delivery an envelope holds: none without its id and delivery tag (an envelope this
/// queue did not deliver, which holds no lease).
fn delivery(envelope: &Envelope) -> Option<Delivery<'_>> {
    let id = envelope.last::<TransportMessageIdStamp>()?.0.as_str();
    let tag = envelope.last::<DeliveryTagStamp>()?.0.as_str();
    let (_, key) = tag.split_once('\n')?;
    Some(Delivery {
        id,
        key,
        lease: format!("{id}\n{tag}"),
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A new message id that sorts in send order: milliseconds since the epoch, then a counter of
/// this process, then random bits. Messages due at the same millisecond come out of the delayed
/// set in id order (a sorted set orders equal scores by member), so a process's messages
/// delayed alike become ready in the order they were sent.
fn new_id() -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "k-{:012x}{seq:08x}{:012x}",
        ms & 0xffff_ffff_ffff,
        fastrand::u64(..) & 0xffff_ffff_ffff
    )
}

impl RedisTransport {
    fn keyed(&self) -> Result<&Keyed, TransportError> {
        self.keyed.as_ref().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Other, self.options.name.clone())
                .with_context("not a keyed queue")
        })
    }

    /// The message's concurrency key: its stamp, else the configured field of its body, else
    /// `""` (the unkeyed lane, not limited).
    fn concurrency_key(
        &self,
        keyed: &Keyed,
        envelope: &Envelope,
        body: &str,
    ) -> Result<String, TransportError> {
        let refuse = |reason: String| {
            TransportError::new(TransportErrorKind::Encode, self.options.name.clone())
                .with_context(format!("message {}: {reason}", envelope.message_name()))
        };
        if let Some(stamp) = envelope.last::<ConcurrencyKeyStamp>() {
            return ConcurrencyKeyStamp::new(stamp.as_str())
                .map(String::from)
                .map_err(|e| refuse(e.to_string()));
        }
        match &keyed.path {
            Some(path) => path.find(body).map(String::from).map_err(refuse),
            None => Ok(String::new()),
        }
    }

    /// Encodes a message for the send and retry scripts: its key, delay (ms) and payload.
    fn keyed_payload(
        &self,
        keyed: &Keyed,
        envelope: &Envelope,
        encoded: &mut EncodedJson,
    ) -> Result<(String, u64, String), TransportError> {
        self.capabilities()
            .check_delay(&self.options.name, envelope)?;
        courier_core::encode_json_into_with(envelope, self.options.serializer, encoded).map_err(
            |e| {
                TransportError::new(TransportErrorKind::Encode, self.options.name.clone())
                    .with_source(e)
            },
        )?;
        let key = self.concurrency_key(keyed, envelope, &encoded.body)?;
        let delay = envelope
            .last::<DelayStamp>()
            .map_or(0, |d| d.0.as_micros().div_ceil(1000));
        let delay = u64::try_from(delay).unwrap_or(u64::MAX);
        Ok((key, delay, format!("{}\n{}", encoded.headers, encoded.body)))
    }

    pub(crate) async fn keyed_send_batch(
        &self,
        envelopes: Vec<Envelope>,
    ) -> Result<Vec<Envelope>, TransportError> {
        let keyed = self.keyed()?;
        let mut encoded = EncodedJson::default();
        let mut pipe = redis::pipe();
        let mut ids = Vec::with_capacity(envelopes.len());
        for chunk in envelopes.chunks(SEND_CHUNK) {
            let mut cmd = self.scripts.keyed_send.cmd(&[]);
            cmd.arg(&keyed.prefix);
            for envelope in chunk {
                let (key, delay, payload) = self.keyed_payload(keyed, envelope, &mut encoded)?;
                let id = new_id();
                cmd.arg(&id).arg(key).arg(delay).arg(payload);
                ids.push(id);
            }
            pipe.add_command(cmd).ignore();
        }
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot send"))?;
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .map(|(envelope, id)| envelope.with(TransportMessageIdStamp(id)))
            .collect())
    }

    /// Acks or rejects (both settle the delivery and free its slot) in one round trip.
    pub(crate) async fn keyed_settle(
        &self,
        envelopes: &[Envelope],
        context: &'static str,
    ) -> Result<(), TransportError> {
        let keyed = self.keyed()?;
        let deliveries: Vec<Delivery> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for chunk in deliveries.chunks(1000) {
            let mut cmd = self.scripts.keyed_ack.cmd(&[]);
            cmd.arg(&keyed.prefix);
            for d in chunk {
                cmd.arg(d.id).arg(d.key).arg(&d.lease);
            }
            pipe.add_command(cmd).ignore();
        }
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, context))
    }

    /// Settles the delivery and stores the message again (after `delay`) in one step.
    pub(crate) async fn keyed_retry(
        &self,
        envelope: Envelope,
        delay: Duration,
    ) -> Result<(), TransportError> {
        let keyed = self.keyed()?;
        let held = delivery(&envelope).map(|d| (d.id.to_owned(), d.key.to_owned(), d.lease));
        let next = envelope.without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        let Some((id, held_key, lease)) = held else {
            return self.keyed_send_batch(vec![next]).await.map(drop);
        };
        let (key, delay_ms, payload) =
            self.keyed_payload(keyed, &next, &mut EncodedJson::default())?;
        let mut cmd = self.scripts.keyed_retry.cmd(&[]);
        cmd.arg(&keyed.prefix)
            .arg(&id)
            .arg(&held_key)
            .arg(&lease)
            .arg(new_id())
            .arg(key)
            .arg(delay_ms)
            .arg(payload);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot retry"))
    }

    /// Extends the leases (and so the slots) this consumer still holds.
    pub(crate) async fn keyed_keepalive(
        &self,
        envelopes: &[Envelope],
    ) -> Result<(), TransportError> {
        let keyed = self.keyed()?;
        let deliveries: Vec<Delivery> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        let mut cmd = self.scripts.keyed_keepalive.cmd(&[]);
        cmd.arg(&keyed.prefix)
            .arg(millis(self.options.redeliver_timeout));
        for d in &deliveries {
            cmd.arg(&d.lease);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot keep alive"))
    }

    /// Every message of the queue: waiting, delayed or delivered and not yet settled.
    pub(crate) async fn keyed_count(&self) -> Result<u64, TransportError> {
        let keyed = self.keyed()?;
        let mut pipe = redis::pipe();
        pipe.cmd("HLEN").arg(format!("{}data", keyed.prefix));
        let (n,): (u64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot count"))?;
        Ok(n)
    }

    /// Takes up to `max` messages; when none can be taken, blocks on the signal stream (woken
    /// by a send, or by an ack that frees a slot of a key with messages waiting) until the poll
    /// window ends or a delayed message or a lease is due.
    pub(crate) async fn keyed_read(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let keyed = self.keyed()?;
        let max = max.max(1);
        let deadline = Instant::now() + self.options.poll_window;
        let reader = self.reader.lock().await;
        let link = reader.link();
        let signal = keyed.signal_key();
        let mut failures = 0;
        loop {
            let attempt = async {
                let (generation, mut conn) = link.get().await.map_err(|e| (u64::MAX, e))?;
                let mut cmd = self.scripts.keyed_claim.cmd(&[]);
                cmd.arg(&keyed.prefix)
                    .arg(max)
                    .arg(millis(self.options.redeliver_timeout))
                    .arg(keyed.max)
                    .arg(if keyed.fair { "1" } else { "0" });
                let reply: Value = match cmd.query_async(&mut conn).await {
                    Ok(v) => v,
                    Err(e) => return Err((generation, e)),
                };
                let (claimed, wait, last) = claim_reply(reply);
                if !claimed.is_empty() {
                    return Ok(claimed);
                }
                let now = Instant::now();
                let mut block = deadline.saturating_duration_since(now);
                if let Some(wait) = wait {
                    block = block.min(wait);
                }
                let block = millis(block);
                if block > 0 {
                    let mut read = redis::cmd("XREAD");
                    read.arg("COUNT")
                        .arg(1)
                        .arg("BLOCK")
                        .arg(block)
                        .arg("STREAMS")
                        .arg(&signal)
                        .arg(last);
                    if let Err(e) = read.query_async::<Value>(&mut conn).await {
                        return Err((generation, e));
                    }
                }
                Ok(Vec::new())
            };
            let error = match attempt.await {
                Ok(entries) if !entries.is_empty() => {
                    return Ok(self.keyed_deliver(entries));
                }
                Ok(_) => None,
                Err((generation, e)) if is_retryable(&e) => {
                    link.reset(generation).await;
                    failures += 1;
                    tracing::warn!(messaging.destination.name = %self.options.stream, error = %e, "redis read failed, reconnecting");
                    Some(e)
                }
                Err((_, e)) => return Err(self.error(e, "cannot read the queue")),
            };
            let now = Instant::now();
            if now >= deadline {
                return match error {
                    Some(e) => Err(self.error(e, "cannot read the queue")),
                    None => Ok(Vec::new()),
                };
            }
            if error.is_some() && failures > 0 {
                tokio::time::sleep(backoff(failures).min(deadline - now)).await;
            }
        }
    }

    fn keyed_deliver(&self, entries: Vec<Claimed>) -> Vec<Envelope> {
        let mut decoder = self.registry.json_decoder();
        entries
            .into_iter()
            .map(|(id, mut payload, tag)| {
                let (body, headers) = match payload.iter().position(|b| *b == b'\n') {
                    Some(at) => {
                        let body = payload.split_off(at + 1);
                        payload.truncate(at);
                        (body, Some(payload))
                    }
                    None => (payload, None),
                };
                decoder
                    .decode_bytes(body, headers.as_deref())
                    .with(TransportMessageIdStamp(id))
                    .with(DeliveryTagStamp(tag))
            })
            .collect()
    }
}

/// A claimed message: its id, payload (headers, newline, body) and delivery tag.
type Claimed = (String, Vec<u8>, String);

/// The claim script's `{ids, payloads, runs of delivery tags {tag, n, ...}, wait ms or -1, last
/// signal id}`: the claimed deliveries (a payload gone since is skipped), how long nothing can
/// be due, and where to wait for a signal.
fn claim_reply(v: Value) -> (Vec<Claimed>, Option<Duration>, String) {
    let Value::Array(parts) = v else {
        return (Vec::new(), None, "$".to_owned());
    };
    let mut parts = parts.into_iter();
    let (ids, payloads, runs) = (parts.next(), parts.next(), parts.next());
    let wait = parts
        .next()
        .as_ref()
        .and_then(reply::int)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis);
    let last = parts
        .next()
        .as_ref()
        .and_then(reply::text)
        .unwrap_or_else(|| "$".to_owned());
    let list = |v: Option<Value>| match v {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let mut tags = Vec::new();
    let mut runs = list(runs).into_iter();
    while let (Some(tag), Some(n)) = (runs.next(), runs.next()) {
        let n = reply::int(&n)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        if let Some(tag) = reply::into_text(tag) {
            tags.extend(std::iter::repeat_n(tag, n));
        }
    }
    let claimed = list(ids)
        .into_iter()
        .zip(list(payloads))
        .zip(tags)
        .filter_map(|((id, payload), tag)| {
            let payload = match payload {
                Value::BulkString(b) => b,
                _ => return None,
            };
            Some((reply::into_text(id)?, payload, tag))
        })
        .collect();
    (claimed, wait, last)
}

/// A keyed queue's loads (a plain queue does not offer the ability).
#[async_trait]
impl KeyedQueue for RedisTransport {
    /// How busy each key is (in flight: its slots in use; queued: ready to deliver, delayed
    /// messages not counted), the `top` busiest and the rest as `other`. Reads every key with messages waiting: one `LLEN` each, in one round trip.
    async fn key_loads(&self, top: usize) -> Result<KeyLoads, TransportError> {
        let Some(keyed) = &self.keyed else {
            // Offered only by a keyed queue: a plain one has no key.
            return Ok(KeyLoads::default());
        };
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(format!("{}busy", keyed.prefix))
            .cmd("LRANGE")
            .arg(format!("{}ring", keyed.prefix))
            .arg(0)
            .arg(-1);
        let (busy, ring): (HashMap<String, u64>, Vec<String>) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot read the keys"))?;
        let mut pipe = redis::pipe();
        for key in &ring {
            pipe.cmd("LLEN").arg(format!("{}q:{key}", keyed.prefix));
        }
        let queued: Vec<u64> = if ring.is_empty() {
            Vec::new()
        } else {
            self.query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot read the keys"))?
        };
        let mut loads: HashMap<String, KeyLoad> = HashMap::new();
        for (key, n) in busy {
            loads
                .entry(key.clone())
                .or_insert_with(|| KeyLoad {
                    key,
                    ..KeyLoad::default()
                })
                .in_flight = n;
        }
        // A key may stay in the ring a visit after its list is gone (see keyed.lua).
        for (key, n) in ring.into_iter().zip(queued).filter(|(_, n)| *n > 0) {
            loads
                .entry(key.clone())
                .or_insert_with(|| KeyLoad {
                    key,
                    ..KeyLoad::default()
                })
                .queued = n;
        }
        let max = (keyed.max > 0).then_some(keyed.max);
        Ok(KeyLoads::top(max, loads.into_values().collect(), top))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn new_ids_sort_in_the_order_they_were_made() {
        let ids: Vec<String> = (0..1000).map(|_| new_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert!(ids.iter().all(|id| id.len() == 34 && id.starts_with("k-")));
    }

    #[test]
    fn reads_the_claim_reply() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("k-1"), bulk("k-2"), bulk("k-3")]),
            Value::Array(vec![bulk("{}\n{\"a\":1}"), Value::Nil, bulk("{}\n{}")]),
            Value::Array(vec![
                bulk("2\nt"),
                Value::Int(1),
                bulk("1\nu"),
                Value::Int(2),
            ]),
            Value::Int(-1),
            bulk("0-0"),
        ]);
        let (entries, wait, _) = claim_reply(reply);
        let got: Vec<(&str, &str)> = entries
            .iter()
            .map(|(id, _, tag)| (id.as_str(), tag.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![("k-1", "2\nt"), ("k-3", "1\nu")],
            "each id with its run's tag; a payload gone is skipped"
        );
        assert_eq!(entries[0].1, b"{}\n{\"a\":1}");
        assert_eq!(wait, None);
        let (none, wait, last) = claim_reply(Value::Array(vec![
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Array(vec![]),
            Value::Int(250),
            bulk("17-0"),
        ]));
        assert!(none.is_empty());
        assert_eq!(wait, Some(Duration::from_millis(250)));
        assert_eq!(last, "17-0");
    }
}
