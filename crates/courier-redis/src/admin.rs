//! Setup, counting and listing ([`Setup`], [`MessageCount`], [`Listable`]).

use courier_core::{
    Envelope, JsonDecoder, Listable, MessageCount, Setup, TransportError, TransportErrorKind,
    TransportMessageIdStamp, async_trait,
};
use redis::Value;

use crate::RedisTransport;
use crate::in_flight::StreamId;
use crate::link::has_code;
use crate::reply;
use crate::transport::is_delayed_id;

/// A delayed payload: headers JSON, newline, body.
fn delayed_parts(payload: &str) -> (&str, &str) {
    payload.split_once('\n').unwrap_or(("", payload))
}

impl RedisTransport {
    /// Listing reads the stream: a keyed queue keeps its messages in lists per key instead.
    fn refuse_keyed(&self) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return Err(TransportError::new(
                TransportErrorKind::Unsupported,
                self.options.name.clone(),
            )
            .with_context(
                "a keyed queue (concurrency_max, fair) cannot list, find or remove messages: \
                 use it as a work queue, not as a failure transport",
            ));
        }
        Ok(())
    }

    fn listed(
        decoder: &mut JsonDecoder<'_>,
        id: String,
        body: Vec<u8>,
        headers: Option<&[u8]>,
    ) -> Envelope {
        decoder
            .decode_bytes(body, headers)
            .with(TransportMessageIdStamp(id))
    }

    fn listed_delayed(decoder: &mut JsonDecoder<'_>, id: String, payload: &str) -> Envelope {
        let (headers, body) = delayed_parts(payload);
        Self::listed(
            decoder,
            id,
            body.as_bytes().to_vec(),
            Some(headers.as_bytes()),
        )
    }
}

#[async_trait]
impl Setup for RedisTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        let mut pipe = redis::pipe();
        pipe.add_command(self.create_group_cmd()).ignore();
        match self.query::<()>(&pipe).await {
            Err(e) if has_code(&e, "BUSYGROUP") => Ok(()),
            other => other.map_err(|e| self.error(e, "cannot create the stream and group")),
        }
    }
}

#[async_trait]
impl MessageCount for RedisTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        if self.keyed.is_some() {
            return self.keyed_count().await;
        }
        let mut pipe = redis::pipe();
        if self.options.delete_after_ack {
            pipe.cmd("XLEN")
                .arg(&self.options.stream)
                .cmd("ZCARD")
                .arg(&self.delayed_key);
            let (stream, delayed): (u64, u64) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot count"))?;
            Ok(stream + delayed)
        } else {
            pipe.add_command(
                self.scripts
                    .count
                    .cmd(&[&self.options.stream, &self.delayed_key])
                    .arg(&self.options.group)
                    .clone(),
            );
            let (count,): (u64,) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot count"))?;
            Ok(count)
        }
    }
}

#[async_trait]
impl Listable for RedisTransport {
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError> {
        self.refuse_keyed()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Redis takes counts and ranges as signed 64-bit integers: "all" (`usize::MAX`, as
        // `failed remove --all` asks) is the largest it accepts.
        let count = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE")
            .arg(&self.options.stream)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count);
        pipe.cmd("ZRANGE")
            .arg(&self.delayed_key)
            .arg(0)
            .arg(count - 1);
        let (range, delayed): (Value, Vec<String>) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot list"))?;
        let mut decoder = self.registry.json_decoder();
        let mut out: Vec<Envelope> = reply::entries(range)
            .into_iter()
            .map(|e| Self::listed(&mut decoder, e.id, e.body, e.headers.as_deref()))
            .collect();
        let room = limit.saturating_sub(out.len());
        let delayed: Vec<String> = delayed.into_iter().take(room).collect();
        if !delayed.is_empty() {
            let mut pipe = redis::pipe();
            pipe.cmd("HMGET").arg(&self.delayed_data_key).arg(&delayed);
            let (payloads,): (Vec<Option<String>>,) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot list"))?;
            for (id, payload) in delayed.into_iter().zip(payloads) {
                if let Some(payload) = payload {
                    out.push(Self::listed_delayed(&mut decoder, id, &payload));
                }
            }
        }
        Ok(out)
    }

    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError> {
        self.refuse_keyed()?;
        let mut pipe = redis::pipe();
        if is_delayed_id(id) {
            pipe.cmd("HGET").arg(&self.delayed_data_key).arg(id);
            let (payload,): (Option<String>,) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot find"))?;
            let mut decoder = self.registry.json_decoder();
            return Ok(payload.map(|p| Self::listed_delayed(&mut decoder, id.to_owned(), &p)));
        }
        // Only a stream entry id (`<ms>-<seq>`) is something `XRANGE` / `XDEL` accept.
        if StreamId::parse(id).is_none() {
            return Ok(None);
        }
        pipe.cmd("XRANGE").arg(&self.options.stream).arg(id).arg(id);
        let (range,): (Value,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot find"))?;
        Ok(reply::entries(range).into_iter().next().map(|e| {
            let mut decoder = self.registry.json_decoder();
            Self::listed(&mut decoder, e.id, e.body, e.headers.as_deref())
        }))
    }

    async fn remove(&self, id: &str) -> Result<bool, TransportError> {
        self.refuse_keyed()?;
        let mut pipe = redis::pipe();
        if is_delayed_id(id) {
            pipe.cmd("ZREM")
                .arg(&self.delayed_key)
                .arg(id)
                .cmd("HDEL")
                .arg(&self.delayed_data_key)
                .arg(id);
            let (removed, _): (u64, u64) = self
                .query(&pipe)
                .await
                .map_err(|e| self.error(e, "cannot remove"))?;
            return Ok(removed > 0);
        }
        let Some(stream_id) = StreamId::parse(id) else {
            return Ok(false);
        };
        // Delete, then ack (a claim of a deleted entry hands out nothing); a missing group is no
        // error here.
        pipe.cmd("XDEL").arg(&self.options.stream).arg(id);
        let (deleted,): (u64,) = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot remove"))?;
        let mut ack = redis::pipe();
        ack.cmd("XACK")
            .arg(&self.options.stream)
            .arg(&self.options.group)
            .arg(id)
            .ignore();
        if let Err(e) = self.query::<()>(&ack).await
            && !has_code(&e, "NOGROUP")
        {
            return Err(self.error(e, "cannot remove"));
        }
        self.in_flight().remove(&stream_id);
        Ok(deleted > 0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn splits_a_delayed_payload() {
        assert_eq!(
            delayed_parts("{\"type\":\"t\"}\nbody\nwith newline"),
            ("{\"type\":\"t\"}", "body\nwith newline")
        );
        assert_eq!(delayed_parts("no newline"), ("", "no newline"));
    }
}
