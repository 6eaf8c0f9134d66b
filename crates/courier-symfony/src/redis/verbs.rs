//! The [`Transport`] verbs of [`RedisTransport`] and its [`Setup`].

use std::time::{Duration, Instant};

use async_trait::async_trait;
use courier_core::{
    Abilities, Capabilities, DelayStamp, Envelope, Setup, Transport, TransportError,
    TransportErrorKind, TransportMessageIdStamp,
};

use super::RedisTransport;

#[async_trait]
impl Transport for RedisTransport {
    fn messaging_system(&self) -> &'static str {
        "redis"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let mut sent = self.send_all(vec![envelope]).await?;
        sent.pop().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Protocol, self.name.clone())
                .with_context("no reply to adding a message")
        })
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        self.send_all(envelopes).await
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.ensure_setup().await?;
        let mut conn = self.conn().await?;
        let (pending_after, claim_due) = {
            let state = self.state();
            (
                state.pending_after.clone(),
                state.next_claim <= Instant::now(),
            )
        };
        // PHP's order: move the due delayed messages, read this consumer's own pending entries,
        // claim others' stale ones, read new ones. The move goes in one round trip with the
        // first read (Redis runs a connection's commands in order).
        let mut moved = false;
        let mut entries = match pending_after {
            Some(after) => {
                let own = self.move_and_read(&mut conn, &after, max).await?;
                moved = true;
                self.state().pending_after = own.last().map(|(id, _)| id.clone());
                own
            }
            None => Vec::new(),
        };
        if entries.is_empty() && claim_due {
            if !moved {
                self.move_due(&mut conn).await?;
                moved = true;
            }
            entries = self.claim(&mut conn, max).await?;
            self.state().next_claim = Instant::now() + self.options.claim_interval;
        }
        if entries.is_empty() {
            entries = if moved {
                self.read_group(&mut conn, ">", max).await?
            } else {
                self.move_and_read(&mut conn, ">", max).await?
            };
        }

        let mut deleted = Vec::new();
        let mut out = Vec::with_capacity(entries.len());
        {
            let mut state = self.state();
            for (id, field) in &entries {
                if field.is_some() {
                    state.in_flight.insert(id.clone());
                } else {
                    deleted.push(id.clone());
                }
            }
        }
        for (id, field) in entries {
            if let Some(field) = field {
                out.push(self.decode(id, &field));
            }
        }
        // Entries deleted while pending: PHP rejects them.
        self.finish(
            deleted,
            self.options.delete_after_reject,
            "rejecting deleted messages",
        )
        .await?;
        Ok(out)
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let id = self.entry_id(envelope)?;
        self.finish(vec![id], self.options.delete_after_ack, "acking a message")
            .await
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        let ids = envelopes
            .iter()
            .map(|e| self.entry_id(e))
            .collect::<Result<Vec<_>, _>>()?;
        self.finish(ids, self.options.delete_after_ack, "acking messages")
            .await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        let id = self.entry_id(envelope)?;
        self.finish(
            vec![id],
            self.options.delete_after_reject,
            "rejecting a message",
        )
        .await
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        let old = envelope.clone();
        let next = envelope
            .without_all::<DelayStamp>()
            .without_all::<TransportMessageIdStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        self.send(next).await?;
        self.reject(&old).await
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.keepalive_batch(std::slice::from_ref(envelope)).await
    }

    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let ids = envelopes
            .iter()
            .map(|e| self.entry_id(e))
            .collect::<Result<Vec<_>, _>>()?;
        let mut conn = self.conn().await?;
        let _kept: u64 = self
            .scripts
            .keepalive
            .key(&self.options.stream)
            .arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg(&ids)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error("keeping messages alive", e))?;
        Ok(())
    }

    fn abilities(&self) -> Abilities<'_> {
        Abilities::none().setup(self)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_delay(None)
            .with_redeliver_after(self.options.redeliver_timeout)
    }
}

#[async_trait]
impl Setup for RedisTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        self.create_group().await?;
        self.state().set_up = true;
        Ok(())
    }

    async fn check(&self) -> Result<(), TransportError> {
        if self.group_exists().await? {
            return Ok(());
        }
        Err(
            TransportError::new(TransportErrorKind::Config, self.name().to_owned()).with_context(
                format!(
                    "consumer group `{}` of stream `{}` is missing (auto_setup is off): run \
                     `courier setup` or PHP's `messenger:setup-transports`",
                    self.options().group,
                    self.options().stream
                ),
            ),
        )
    }
}
