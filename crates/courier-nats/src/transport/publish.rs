//! Publishing: one envelope to its subject (a delayed one to the delay subject), its PubAck,
//! and the errors of both.

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use courier_core::{
    DelayStamp, Envelope, MessageIdStamp, TransportError, TransportErrorKind, encode_with,
};

use super::NatsTransport;
use crate::errors::{nats_error, publish_kind};
use crate::link::Session;
use crate::wire;

impl NatsTransport {
    /// Publishes one envelope (a delayed one on the delay subject); returns the PubAck to
    /// await.
    pub(super) async fn publish(
        &self,
        session: &Session,
        envelope: &Envelope,
    ) -> Result<(PublishAckFuture, bool), TransportError> {
        self.capabilities.check_delay(self.name(), envelope)?;
        let o = &self.link.options;
        let encoded = encode_with(envelope, o.serializer).map_err(|e| {
            TransportError::new(TransportErrorKind::Encode, self.name().to_owned()).with_source(e)
        })?;
        let delay = envelope.last::<DelayStamp>().map(|d| d.0);
        let msg_id = envelope
            .last::<MessageIdStamp>()
            .map(|id| wire::msg_id(&id.0, &encoded));
        let headers = wire::headers(&encoded, delay, msg_id)
            .map_err(|reason| self.error(TransportErrorKind::Encode, reason))?;
        let message = PublishMessage::build()
            .payload(encoded.body.into_bytes().into())
            .headers(headers);
        let delayed = delay.is_some_and(|d| !d.is_zero());
        let subject = if delayed {
            o.delay_subject_name()
        } else {
            o.subject.clone()
        };
        match session.jetstream.send_publish(subject, message).await {
            Ok(ack) => Ok((ack, delayed)),
            Err(e) => Err(self.publish_error(e, delayed).await),
        }
    }

    async fn publish_error(
        &self,
        e: async_nats::jetstream::context::PublishError,
        delayed: bool,
    ) -> TransportError {
        let kind = publish_kind(&e.kind());
        if kind == TransportErrorKind::NotFound {
            // The stream vanished: set it up again next time.
            self.link.invalidate().await;
        }
        let o = &self.link.options;
        let context = if delayed && kind == TransportErrorKind::NotFound {
            format!(
                "publish of a delayed message to `{}` failed: no stream captures that subject \
                 (stream `{}` captures it once set up: run setup, or enable auto_setup)",
                o.delay_subject_name(),
                o.stream
            )
        } else if delayed {
            format!(
                "publish of a delayed message to `{}` failed",
                o.delay_subject_name()
            )
        } else {
            format!("publish to `{}` failed", o.subject)
        };
        nats_error(self.name(), kind, context, e)
    }

    /// Awaits one PubAck (bounded by the request timeout); returns the stream sequence.
    pub(super) async fn confirmed(
        &self,
        (ack, delayed): (PublishAckFuture, bool),
    ) -> Result<u64, TransportError> {
        match ack.await {
            Ok(ack) => Ok(ack.sequence),
            Err(e) => Err(self.publish_error(e, delayed).await),
        }
    }
}
