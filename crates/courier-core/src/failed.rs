//! Messages in failure transports, as operators see and handle them (`courier failed`, the
//! dashboard): the summary of one failed message ([`FailedMessage`], the shape of `courier
//! failed show --format json`), the failure transports of a configuration, and the retry that
//! sends a failed message back to the transport it failed on ([`retry_failed`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::config::Transports;
use crate::{
    DelayStamp, DeliveryTagStamp, Envelope, ErrorDetailsStamp, Listable, ReceivedStamp,
    RedeliveryStamp, SentToFailureTransportStamp, TransportError, TransportMessageIdStamp,
    retry_count,
};

/// One failed message, as `courier failed show --format json` prints it (times RFC 3339).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FailedMessage {
    /// Its id in the failure transport.
    pub id: Option<String>,
    /// The message's wire name.
    #[serde(rename = "type")]
    pub kind: String,
    /// The transport it failed on.
    pub transport: Option<String>,
    /// The class of its last error.
    pub error_class: Option<String>,
    /// The message of its last error.
    pub error: Option<String>,
    /// How many times it was retried before it failed for good.
    pub retry_count: u32,
    /// When it was moved to the failure transport.
    pub failed_at: Option<String>,
    /// The failure transport holding it.
    pub failure_transport: String,
}

impl FailedMessage {
    /// The summary of `envelope`, stored in the failure transport `failure_transport`.
    #[must_use]
    pub fn new(failure_transport: &str, envelope: &Envelope) -> Self {
        let details = envelope.last::<ErrorDetailsStamp>();
        let moved = envelope.last::<SentToFailureTransportStamp>();
        Self {
            id: envelope.id().map(str::to_owned),
            kind: envelope.message_name().to_owned(),
            transport: moved.map(|s| s.original.clone()),
            error_class: details.map(|d| d.class.clone()),
            error: details.map(|d| d.message.clone()),
            retry_count: retry_count(envelope),
            failed_at: moved.map(|s| rfc3339(s.at)),
            failure_transport: failure_transport.to_owned(),
        }
    }
}

/// `2026-11-30T01:02:03.456Z`.
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An epoch-milliseconds time (as stores keep them) as RFC 3339; negative times are the epoch.
#[must_use]
pub fn rfc3339_ms(ms: i64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// Retrying a failed message went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetryFailedError {
    /// The message carries no [`SentToFailureTransportStamp`].
    #[error("message `{id}` does not say which transport it failed on")]
    NoOrigin {
        /// The message id.
        id: String,
    },
    /// The transport it failed on is not configured (any more).
    #[error("message `{id}` failed on transport `{transport}`, which is not configured")]
    UnknownTransport {
        /// The message id.
        id: String,
        /// The transport it names.
        transport: String,
    },
    /// Sending it back or removing it failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Sends a failed `envelope` back to the transport it failed on, as new (see
/// [`for_retry`]), then removes it from the failure transport `failures`: a crash between the
/// two leaves a copy in both places, never none. Returns its id.
///
/// # Errors
/// [`RetryFailedError`]: it names no origin, its origin is not configured, or a transport failed.
pub async fn retry_failed(
    transports: &Transports,
    failures: &dyn Listable,
    envelope: Envelope,
) -> Result<String, RetryFailedError> {
    retry_failed_to(transports, failures, envelope, None).await
}

/// [`retry_failed`], to the transport `to` instead of the one it failed on when given
/// (`courier failed retry --to T`).
///
/// # Errors
/// As [`retry_failed`]; `to` must be configured.
pub async fn retry_failed_to(
    transports: &Transports,
    failures: &dyn Listable,
    envelope: Envelope,
    to: Option<&str>,
) -> Result<String, RetryFailedError> {
    let id = envelope.id().unwrap_or_default().to_owned();
    let original = match to {
        Some(to) => to.to_owned(),
        None => envelope
            .last::<SentToFailureTransportStamp>()
            .map(|s| s.original.clone())
            .ok_or_else(|| RetryFailedError::NoOrigin { id: id.clone() })?,
    };
    let target = transports
        .get(&original)
        .ok_or_else(|| RetryFailedError::UnknownTransport {
            id: id.clone(),
            transport: original,
        })?;
    target.send(for_retry(envelope)).await?;
    failures.remove(&id).await?;
    Ok(id)
}

/// The envelope as it goes back to its original transport: no failure marker, no delay, no
/// retries counted, no ids of the failure transport (the error history stays).
#[must_use]
pub fn for_retry(e: Envelope) -> Envelope {
    e.without_all::<SentToFailureTransportStamp>()
        .without_all::<TransportMessageIdStamp>()
        .without_all::<DeliveryTagStamp>()
        .without_all::<ReceivedStamp>()
        .without_all::<DelayStamp>()
        .without_all::<RedeliveryStamp>()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::{Message, TransportRegistry};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Ping;
    impl Message for Ping {
        const NAME: &'static str = "test.ping";
    }

    async fn transports() -> Transports {
        let config: Config =
            "[transports.async]\ndsn = \"in-memory://\"\nfailure_transport = \"failed\"\n\
             [transports.failed]\ndsn = \"in-memory://\"\n"
                .parse()
                .expect("config");
        let mut registry = crate::MessageRegistry::new();
        registry.register::<Ping>();
        config
            .connect(&TransportRegistry::new(), Arc::new(registry))
            .await
            .expect("connect")
    }

    #[tokio::test]
    async fn a_retried_message_goes_back_to_its_transport_as_new() {
        let t = transports().await;
        assert_eq!(
            t.config().failure_transport_names(),
            vec!["failed".to_owned()]
        );
        let failed = t.get("failed").expect("failed").clone();
        failed
            .send(
                Envelope::new(Ping)
                    .with(SentToFailureTransportStamp::new("async"))
                    .with(RedeliveryStamp::new(3)),
            )
            .await
            .expect("send");
        let list = failed.as_listable().expect("listable");
        let stored = list.list(10).await.expect("list").remove(0);
        let summary = FailedMessage::new("failed", &stored);
        assert_eq!(summary.transport.as_deref(), Some("async"));
        assert_eq!(summary.retry_count, 3);
        let id = retry_failed(&t, list, stored).await.expect("retry");
        assert!(list.find(&id).await.expect("find").is_none());
        let back = t.get("async").expect("async").get(10).await.expect("get");
        assert_eq!(back.len(), 1);
        assert!(!back[0].has::<SentToFailureTransportStamp>());
        assert_eq!(retry_count(&back[0]), 0);
        let counts = t.message_counts(&[]).await.expect("counts");
        assert_eq!(counts.get("failed"), Some(&Some(0)));
    }

    #[tokio::test]
    async fn a_message_without_origin_is_not_retried() {
        let t = transports().await;
        let failed = t.get("failed").expect("failed").clone();
        failed.send(Envelope::new(Ping)).await.expect("send");
        let list = failed.as_listable().expect("listable");
        let stored = list.list(10).await.expect("list").remove(0);
        let err = retry_failed(&t, list, stored).await.expect_err("no origin");
        assert!(matches!(err, RetryFailedError::NoOrigin { .. }), "{err}");
        assert_eq!(list.list(10).await.expect("list").len(), 1);
    }
}
