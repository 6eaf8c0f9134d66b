//! `get`: recovering this consumer's own pending entries, claiming stale deliveries, promoting
//! due delayed entries and `XREADGROUP`, on a dedicated connection.

use std::time::Duration;

use courier_core::{Envelope, TransportError};
use redis::{RedisError, Value};
use tokio::time::Instant;

use crate::RedisTransport;
use crate::link::{backoff, has_code};
use crate::reader::Reader;
use crate::reply::{self, Entry};
use crate::transport::is_retryable;

/// Due delayed entries moved to the stream per promotion.
const PROMOTE_LIMIT: usize = 1000;
/// Without a known due entry, delayed entries are promoted at least this often (and before
/// every blocking read that follows a quieter period), so a busy consumer does not pay for the
/// promotion script on every `get`.
const PROMOTE_EVERY: Duration = Duration::from_millis(100);
/// Consumers with nothing pending are removed after being idle this long (at least).
const REAP_IDLE: Duration = Duration::from_secs(600);

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisTransport {
    /// Receives up to `max` envelopes, waiting up to the poll window; reconnects (with capped
    /// backoff) inside that window when the connection broke.
    pub(crate) async fn read(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let max = max.max(1);
        let deadline = Instant::now() + self.options.poll_window;
        let mut reader = self.reader.lock().await;
        if reader.reading {
            reader.recover = true;
        }
        loop {
            let requested_at = Instant::now();
            reader.reading = true;
            let read = self.read_once(&mut reader, max, deadline).await;
            reader.reading = false;
            let error = match read {
                Ok(entries) if !entries.is_empty() => {
                    reader.failures = 0;
                    return Ok(self.deliver(entries, requested_at));
                }
                Ok(_) => {
                    reader.failures = 0;
                    None
                }
                Err(e) if has_code(&e, "NOGROUP") => {
                    // The stream or group vanished (evicted, deleted): recreate and go on.
                    reader.group_ready = false;
                    Some(e)
                }
                Err(e) if is_retryable(&e) => {
                    let generation = reader.generation;
                    reader.link.reset(generation).await;
                    reader.failures += 1;
                    tracing::warn!(messaging.destination.name = %self.options.stream, error = %e, "redis read failed, reconnecting");
                    Some(e)
                }
                Err(e) => return Err(self.error(e, "cannot read the stream")),
            };
            let now = Instant::now();
            if now >= deadline {
                return match error {
                    Some(e) => Err(self.error(e, "cannot read the stream")),
                    None => Ok(Vec::new()),
                };
            }
            if error.is_some() && reader.failures > 0 {
                tokio::time::sleep(backoff(reader.failures).min(deadline - now)).await;
            }
        }
    }

    async fn read_once(
        &self,
        reader: &mut Reader,
        max: usize,
        deadline: Instant,
    ) -> Result<Vec<Entry>, RedisError> {
        let (generation, mut conn) = reader.link.get().await?;
        if generation != reader.generation {
            // A new connection: a reply lost with the old one may have left entries pending
            // for this consumer that nobody holds; take them back.
            reader.generation = generation;
            reader.recover = true;
        }
        let stream = self.options.stream.as_str();
        if !reader.group_ready {
            self.create_group(&mut conn).await?;
            reader.group_ready = true;
        }
        if reader.recover {
            let skip: Vec<String> = self.in_flight().keys().map(ToString::to_string).collect();
            let mut cmd = self.scripts.recover.cmd(&[stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(max)
                .arg(skip);
            let recovered: Value = cmd.query_async(&mut conn).await?;
            reader.recover = false;
            let entries = reply::entries(recovered);
            if !entries.is_empty() {
                return Ok(entries);
            }
        }
        let now = Instant::now();
        if now >= reader.next_claim {
            reader.next_claim = now + self.options.effective_claim_interval();
            let mut cmd = self.scripts.claim.cmd(&[stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(millis(self.options.redeliver_timeout))
                .arg(&reader.cursor)
                .arg(max)
                .arg(millis(REAP_IDLE.max(self.options.redeliver_timeout)));
            let claimed: Value = cmd.query_async(&mut conn).await?;
            let (cursor, entries) = reply::claim_reply(claimed);
            reader.cursor = cursor;
            if !entries.is_empty() {
                return Ok(entries);
            }
        }
        let now = Instant::now();
        let hint = self
            .due_hint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let next_due = match (reader.next_due, hint) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut wait = deadline.saturating_duration_since(now);
        if let Some(due) = next_due {
            wait = wait.min(due.saturating_duration_since(now));
        }
        let promote = now >= reader.next_promote || next_due.is_some_and(|due| due <= now);
        let mut pipe = redis::Pipeline::with_capacity(2);
        if promote {
            pipe.add_command(
                self.scripts
                    .promote
                    .cmd(&[stream, &self.delayed_key, &self.delayed_data_key])
                    .arg(&self.maxlen)
                    .arg(PROMOTE_LIMIT)
                    .clone(),
            );
        }
        let names = self.options.group.len() + self.options.consumer.len() + stream.len();
        let mut read = redis::Cmd::with_capacity(12, names + 64);
        read.arg("XREADGROUP")
            .arg("GROUP")
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg("COUNT")
            .arg(max);
        let block = millis(wait);
        if block > 0 {
            read.arg("BLOCK").arg(block);
        }
        read.arg("STREAMS").arg(stream).arg(">");
        pipe.add_command(read);
        let replied = if promote {
            let (next_wait, replied): (i64, Value) = pipe.query_async(&mut conn).await?;
            reader.next_due = u64::try_from(next_wait)
                .ok()
                .map(|ms| now + Duration::from_millis(ms));
            reader.next_promote = now + PROMOTE_EVERY;
            replied
        } else {
            reader.next_due = next_due;
            let (replied,): (Value,) = pipe.query_async(&mut conn).await?;
            replied
        };
        Ok(reply::read_reply(replied))
    }
}
