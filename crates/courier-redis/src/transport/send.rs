//! Sending: the `XADD`s and delayed entries a send adds to a pipeline.

use std::time::Duration;

use courier_core::{DelayStamp, EncodedJson, Envelope, Transport, TransportError};
use tokio::time::Instant;

use super::RedisTransport;

pub(super) fn delay_ms(delay: Duration) -> u64 {
    u64::try_from(delay.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

impl RedisTransport {
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

    pub(super) fn hint_due(&self, delay: Duration) {
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
    pub(super) fn add_sends(
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
}
