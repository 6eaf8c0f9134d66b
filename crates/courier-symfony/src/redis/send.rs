//! Sending: a batch's `XADD`s (and delayed members) in one pipeline, each `message` field
//! written straight into its command.

use courier_core::{
    DelayStamp, EncodedJson, Envelope, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp,
};
use redis::Value;

use super::{RedisTransport, wire};
use crate::redis_field;

impl RedisTransport {
    /// Adds the commands that store `envelope` to `pipe`: an entry, or a member of the delayed
    /// set. The id it will have is the entry's (from the reply) or the member's `uniqid`. `buf`
    /// and `json` are the batch's buffers for Courier's text and for a `message` field.
    fn push_send(
        &self,
        pipe: &mut redis::Pipeline,
        envelope: &Envelope,
        buf: &mut EncodedJson,
        json: &mut String,
    ) -> Result<(), TransportError> {
        let encode_error =
            |e| TransportError::new(TransportErrorKind::Encode, self.name.clone()).with_source(e);
        let delay = envelope.last::<DelayStamp>().map_or(0, |DelayStamp(d)| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
        });
        if delay > 0 {
            let wire = self
                .serializer
                .encode(&self.registry, envelope)
                .map_err(encode_error)?;
            let due = wire::now_ms().saturating_add(delay);
            pipe.cmd("ZADD")
                .arg(&self.queue)
                .arg("NX")
                .arg(due)
                .arg(wire::queue_member(&wire));
        } else {
            // Written straight into the field, from headers borrowed where they can be, and
            // the field straight into a command sized for it.
            self.serializer
                .encode_into_with(&self.registry, envelope, buf, |body, headers| {
                    redis_field::write_json(json, body, headers.iter().map(|(k, v)| (&**k, &**v)));
                })
                .map_err(encode_error)?;
            let field = redis_field::FieldArg {
                json,
                php_serialized: self.options.php_serializer,
            };
            let mut cmd =
                redis::Cmd::with_capacity(9, self.options.stream.len() + field.len() + 64);
            cmd.arg("XADD").arg(&self.options.stream);
            if self.options.stream_max_entries > 0 {
                cmd.arg("MAXLEN")
                    .arg("~")
                    .arg(self.options.stream_max_entries);
            }
            cmd.arg("*").arg("message").arg(field);
            pipe.add_command(cmd);
        }
        Ok(())
    }

    /// Stores a batch in one pipeline; an envelope stored as an entry comes back with the
    /// entry's id as a `TransportMessageIdStamp` (a delayed one, whose id is its member's
    /// `uniqid`, without).
    pub(super) async fn send_all(
        &self,
        envelopes: Vec<Envelope>,
    ) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        self.ensure_setup().await?;
        let mut pipe = redis::pipe();
        let (mut buf, mut json) = (EncodedJson::default(), String::new());
        for envelope in &envelopes {
            self.capabilities().check_delay(&self.name, envelope)?;
            self.push_send(&mut pipe, envelope, &mut buf, &mut json)?;
        }
        let mut conn = self.conn().await?;
        let replies: Vec<Value> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error("adding messages", e))?;
        Ok(envelopes
            .into_iter()
            .zip(replies)
            .map(|(envelope, reply)| match reply {
                Value::BulkString(_) => match wire::into_text(reply) {
                    Some(id) => envelope.with(TransportMessageIdStamp(id)),
                    None => envelope,
                },
                _ => envelope,
            })
            .collect())
    }
}
