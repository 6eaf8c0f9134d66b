//! async-nats errors as [`TransportError`]s: every error kind of each operation maps to a
//! [`TransportErrorKind`], in an exhaustive match, so a new kind does not compile until someone
//! decides whether it is transient.

use courier_core::{TransportError, TransportErrorKind};

/// An error of async-nats as a transport error of `kind`, with context; the cause is chained.
pub(crate) fn nats_error(
    name: &str,
    kind: TransportErrorKind,
    context: impl Into<String>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> TransportError {
    TransportError::new(kind, name.to_owned())
        .with_context(context.into())
        .with_source(source)
}

/// The kind of a failed connect: unreachable and timed out are transient; refused credentials
/// and a bad address are configuration errors.
pub(crate) fn connect_kind(kind: &async_nats::ConnectErrorKind) -> TransportErrorKind {
    use async_nats::ConnectErrorKind as K;
    match kind {
        K::Io | K::Dns | K::MaxReconnects => TransportErrorKind::Connection,
        K::TimedOut => TransportErrorKind::Timeout,
        K::Authentication | K::AuthorizationViolation | K::ServerParse | K::Tls => {
            TransportErrorKind::Config
        }
    }
}

/// The kind of a failed publish: a missing PubAck or a broken connection is transient (the
/// publish may or may not have been stored: `Nats-Msg-Id` deduplicates a resend of an
/// envelope with a message id), no stream is `NotFound`, an oversized message `Unsupported`.
pub(crate) fn publish_kind(
    kind: &async_nats::jetstream::context::PublishErrorKind,
) -> TransportErrorKind {
    use async_nats::jetstream::context::PublishErrorKind as K;
    match kind {
        K::TimedOut | K::MaxAckPending => TransportErrorKind::Timeout,
        K::BrokenPipe => TransportErrorKind::Connection,
        K::StreamNotFound => TransportErrorKind::NotFound,
        K::MaxPayloadExceeded => TransportErrorKind::Unsupported,
        K::WrongLastMessageId | K::WrongLastSequence | K::Other => TransportErrorKind::Protocol,
    }
}

/// The kind of a failed core request (an ack, a nak, a progress): no answer in time is
/// transient, no responder means the consumer is gone.
pub(crate) fn request_kind(kind: &async_nats::RequestErrorKind) -> TransportErrorKind {
    use async_nats::RequestErrorKind as K;
    match kind {
        K::TimedOut => TransportErrorKind::Timeout,
        K::NoResponders => TransportErrorKind::NotFound,
        K::InvalidSubject | K::MaxPayloadExceeded => TransportErrorKind::Protocol,
        K::Other => TransportErrorKind::Connection,
    }
}

pub(crate) fn create_stream_kind(
    kind: &async_nats::jetstream::context::CreateStreamErrorKind,
) -> TransportErrorKind {
    use async_nats::jetstream::context::CreateStreamErrorKind as K;
    match kind {
        K::TimedOut => TransportErrorKind::Timeout,
        K::JetStreamUnavailable => TransportErrorKind::Connection,
        K::EmptyStreamName | K::InvalidStreamName | K::DomainAndExternalSet => {
            TransportErrorKind::Config
        }
        K::NotFound => TransportErrorKind::NotFound,
        K::JetStream(_) | K::Response | K::ResponseParse => TransportErrorKind::Protocol,
    }
}

pub(crate) fn consumer_kind(
    kind: &async_nats::jetstream::stream::ConsumerErrorKind,
) -> TransportErrorKind {
    use async_nats::jetstream::stream::ConsumerErrorKind as K;
    match kind {
        K::TimedOut => TransportErrorKind::Timeout,
        K::Request => TransportErrorKind::Connection,
        K::InvalidName => TransportErrorKind::Config,
        K::JetStream(e) if e.code() == 404 => TransportErrorKind::NotFound,
        K::InvalidConsumerType | K::JetStream(_) | K::Other => TransportErrorKind::Protocol,
    }
}

pub(crate) fn get_stream_kind(
    kind: &async_nats::jetstream::context::GetStreamErrorKind,
) -> TransportErrorKind {
    use async_nats::jetstream::context::GetStreamErrorKind as K;
    match kind {
        K::Request => TransportErrorKind::Connection,
        K::EmptyName | K::InvalidStreamName => TransportErrorKind::Config,
        K::JetStream(e) if e.code() == 404 => TransportErrorKind::NotFound,
        K::JetStream(_) => TransportErrorKind::Protocol,
    }
}

/// The kind of a failed JetStream API call: no answer in time, or no JetStream to answer (a
/// server restarting), is transient.
pub(crate) fn info_kind(
    kind: &async_nats::jetstream::context::RequestErrorKind,
) -> TransportErrorKind {
    use async_nats::jetstream::context::RequestErrorKind as K;
    match kind {
        K::TimedOut => TransportErrorKind::Timeout,
        K::NoResponders | K::Other => TransportErrorKind::Connection,
        K::InvalidSubject => TransportErrorKind::Config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_trouble_is_transient_and_refused_credentials_are_not() {
        use async_nats::ConnectErrorKind as K;
        for k in [K::Io, K::Dns, K::TimedOut, K::MaxReconnects] {
            assert!(connect_kind(&k).is_transient(), "{k:?}");
        }
        for k in [
            K::Authentication,
            K::AuthorizationViolation,
            K::ServerParse,
            K::Tls,
        ] {
            assert_eq!(connect_kind(&k), TransportErrorKind::Config, "{k:?}");
        }
        use async_nats::jetstream::context::PublishErrorKind as P;
        assert!(publish_kind(&P::TimedOut).is_transient());
        assert!(publish_kind(&P::BrokenPipe).is_transient());
        assert_eq!(
            publish_kind(&P::StreamNotFound),
            TransportErrorKind::NotFound
        );
        assert_eq!(
            publish_kind(&P::MaxPayloadExceeded),
            TransportErrorKind::Unsupported
        );
        assert!(request_kind(&async_nats::RequestErrorKind::TimedOut).is_transient());
        assert!(!request_kind(&async_nats::RequestErrorKind::NoResponders).is_transient());
    }
}
