//! The stamps Courier itself reads and writes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::Stamp;

/// Serde helpers: durations as integer milliseconds, times as epoch milliseconds (language-neutral).
pub(crate) mod wire {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub(crate) fn to_epoch_ms(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    pub(crate) fn epoch() -> SystemTime {
        UNIX_EPOCH
    }

    pub(crate) fn from_epoch_ms(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    pub(crate) mod millis {
        use super::*;
        pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
            Ok(Duration::from_millis(u64::deserialize(d)?))
        }
    }

    pub(crate) mod epoch_ms {
        use super::*;
        pub(crate) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_u64(to_epoch_ms(*t))
        }
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
            Ok(from_epoch_ms(u64::deserialize(d)?))
        }
    }
}

/// Deliver the message no earlier than this long after it was sent.
///
/// On the wire: `x-courier-stamp-delay: [1500]` (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayStamp(#[serde(with = "wire::millis")] pub Duration);

impl DelayStamp {
    /// A delay that ends at `at` (zero when `at` is in the past).
    #[must_use]
    pub fn until(at: SystemTime) -> Self {
        Self(at.duration_since(SystemTime::now()).unwrap_or_default())
    }
}

/// Shorthand for [`DelayStamp::until`].
#[must_use]
pub fn delay_until(at: SystemTime) -> DelayStamp {
    DelayStamp::until(at)
}

impl Stamp for DelayStamp {
    const NAME: &'static str = "delay";
}

/// The message is being redelivered after a failure: the `retry_count`-th retry, decided `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedeliveryStamp {
    /// 1 for the first retry.
    pub retry_count: u32,
    /// When the retry was decided.
    #[serde(with = "wire::epoch_ms")]
    pub at: SystemTime,
}

impl RedeliveryStamp {
    /// A stamp for the given retry, dated now.
    #[must_use]
    pub fn new(retry_count: u32) -> Self {
        Self {
            retry_count,
            at: SystemTime::now(),
        }
    }
}

impl Stamp for RedeliveryStamp {
    const NAME: &'static str = "redelivery";
}

/// Why handling failed: the error class, its message and its cause chain.
///
/// Bounded: [`ErrorDetailsStamp::new`] keeps the first cause and the last ten, and cuts each text
/// at [`ErrorDetailsStamp::MAX_TEXT`] bytes, so a message that fails many times does not grow
/// without limit. [`Envelope::with_error_details`](crate::Envelope::with_error_details) also keeps
/// only the first and the last ten stamps of this kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetailsStamp {
    /// The failure class, e.g. `"recoverable"`, `"unrecoverable"`, `"decode"`.
    pub class: String,
    /// The top-level error message.
    pub message: String,
    /// The error's sources, outermost first (bounded).
    pub chain: Vec<String>,
}

impl ErrorDetailsStamp {
    /// The longest message or chain entry kept, in bytes.
    pub const MAX_TEXT: usize = 2048;
    /// How many trailing chain entries are kept besides the first.
    pub const KEEP_LAST: usize = 10;

    /// Details for `class`, `message` and a cause chain, bounded as documented above.
    #[must_use]
    pub fn new(class: impl Into<String>, message: impl Into<String>, chain: Vec<String>) -> Self {
        let chain = keep_first_and_last(chain, Self::KEEP_LAST)
            .into_iter()
            .map(|s| truncate(s, Self::MAX_TEXT))
            .collect();
        Self {
            class: class.into(),
            message: truncate(message.into(), Self::MAX_TEXT),
            chain,
        }
    }

    /// Details from an error and its `source()` chain.
    #[must_use]
    pub fn from_error(class: impl Into<String>, error: &(dyn std::error::Error + 'static)) -> Self {
        let mut chain = Vec::new();
        let mut cur = error.source();
        while let Some(e) = cur {
            chain.push(e.to_string());
            cur = e.source();
        }
        Self::new(class, error.to_string(), chain)
    }
}

pub(crate) fn keep_first_and_last<T>(mut items: Vec<T>, last: usize) -> Vec<T> {
    if items.len() > last + 1 {
        items.drain(1..items.len() - last);
    }
    items
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl Stamp for ErrorDetailsStamp {
    const NAME: &'static str = "error-details";
}

/// The envelope was sent to `transport` (local).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentStamp {
    /// The transport name.
    pub transport: String,
}

impl Stamp for SentStamp {
    const NAME: &'static str = "sent";
    const SENDABLE: bool = false;
}

/// The envelope was received from the named transport (local). A received envelope is handled,
/// never sent again by the bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceivedStamp(pub String);

impl Stamp for ReceivedStamp {
    const NAME: &'static str = "received";
    const SENDABLE: bool = false;
}

/// The named handler already handled this message successfully; a retry skips it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandledStamp {
    /// The handler's name.
    pub handler: String,
}

impl Stamp for HandledStamp {
    const NAME: &'static str = "handled";
}

/// The id the transport gave the message (row id, stream entry id, AMQP message id). Local.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransportMessageIdStamp(pub String);

impl Stamp for TransportMessageIdStamp {
    const NAME: &'static str = "transport-message-id";
    const SENDABLE: bool = false;
}

/// The message's own id, the same wherever it goes: created when it is first dispatched (by the
/// bus, unless the envelope carries one already) and kept across retries, the failure
/// transport, a relay from an outbox and every transport's wire format. What an inbox
/// ([`courier_sql::Inbox`](https://docs.rs/courier-sql)) records to handle a message once.
///
/// On the wire: `x-courier-stamp-message-id: ["0b9d7c1e-..."]` (a UUID, version 4, as text; a
/// producer in another language may write any unique string of at most 64 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MessageIdStamp(pub String);

impl MessageIdStamp {
    /// A fresh random id (a version 4 UUID from the thread's fast generator: unique, not
    /// secret).
    #[must_use]
    pub fn new() -> Self {
        let bytes = fastrand::u128(..).to_le_bytes();
        Self(
            uuid::Builder::from_random_bytes(bytes)
                .into_uuid()
                .to_string(),
        )
    }
}

impl Default for MessageIdStamp {
    fn default() -> Self {
        Self::new()
    }
}

impl Stamp for MessageIdStamp {
    const NAME: &'static str = "message-id";
}

/// The bus that dispatched the message; the worker dispatches it on the same bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusNameStamp(pub String);

impl Stamp for BusNameStamp {
    const NAME: &'static str = "bus-name";
}

/// The message was moved to a failure transport after failing on `original`, `at` a time.
///
/// On the wire: `{"original":"async","at":1700000000000}` (`at` in epoch ms; a producer may
/// leave it out, which reads as the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentToFailureTransportStamp {
    /// The name of the transport the message originally failed on.
    pub original: String,
    /// When it was moved.
    #[serde(with = "wire::epoch_ms", default = "wire::epoch")]
    pub at: SystemTime,
}

impl SentToFailureTransportStamp {
    /// A stamp for a message failed on `original`, dated now.
    #[must_use]
    pub fn new(original: impl Into<String>) -> Self {
        Self {
            original: original.into(),
            at: SystemTime::now(),
        }
    }
}

impl Stamp for SentToFailureTransportStamp {
    const NAME: &'static str = "sent-to-failure-transport";
}

/// Dispatch this message only after the message currently being handled has been handled
/// successfully (and drop it if that fails). Local.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DispatchAfterCurrentBusStamp;

impl Stamp for DispatchAfterCurrentBusStamp {
    const NAME: &'static str = "dispatch-after-current-bus";
    const SENDABLE: bool = false;
}

/// Send this message to these transports instead of what routing says. Local.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportNamesStamp(pub Vec<String>);

impl Stamp for TransportNamesStamp {
    const NAME: &'static str = "transport-names";
    const SENDABLE: bool = false;
}

/// Delivery priority: higher first, on transports that support priorities. Default 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PriorityStamp(pub u8);

impl Stamp for PriorityStamp {
    const NAME: &'static str = "priority";
}

/// The message's concurrency key: on a transport with a concurrency limit (SQL
/// `concurrency_max`), at most that many messages with the same key are delivered and not yet
/// acknowledged at once, across every worker and host. 1 to [`Self::MAX_LEN`] bytes.
///
/// On the wire: `x-courier-stamp-concurrency-key: ["tenant-42"]`.
///
/// ```
/// use courier_core::ConcurrencyKeyStamp;
///
/// assert_eq!(ConcurrencyKeyStamp::new("tenant-42")?.as_str(), "tenant-42");
/// assert!(ConcurrencyKeyStamp::new("").is_err());
/// assert!(ConcurrencyKeyStamp::new("k".repeat(201)).is_err());
/// # Ok::<(), courier_core::InvalidConcurrencyKey>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ConcurrencyKeyStamp(String);

/// A concurrency key that is empty or longer than [`ConcurrencyKeyStamp::MAX_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid concurrency key: {0}")]
pub struct InvalidConcurrencyKey(String);

impl ConcurrencyKeyStamp {
    /// The longest key, in bytes.
    pub const MAX_LEN: usize = 200;

    /// A key of 1 to [`Self::MAX_LEN`] bytes.
    ///
    /// # Errors
    /// [`InvalidConcurrencyKey`] for an empty key or one longer than [`Self::MAX_LEN`] bytes
    /// (the message shows the key's length and its first 32 characters).
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidConcurrencyKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidConcurrencyKey(
                "empty, expected 1 to 200 bytes".to_owned(),
            ));
        }
        if key.len() > Self::MAX_LEN {
            let head: String = key.chars().take(32).collect();
            return Err(InvalidConcurrencyKey(format!(
                "`{head}...` is {} bytes, expected at most {}",
                key.len(),
                Self::MAX_LEN
            )));
        }
        Ok(Self(key))
    }

    /// The key.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ConcurrencyKeyStamp {
    type Error = InvalidConcurrencyKey;
    fn try_from(key: String) -> Result<Self, Self::Error> {
        Self::new(key)
    }
}

impl From<ConcurrencyKeyStamp> for String {
    fn from(key: ConcurrencyKeyStamp) -> Self {
        key.0
    }
}

impl Stamp for ConcurrencyKeyStamp {
    const NAME: &'static str = "concurrency-key";
}

/// W3C trace context (`traceparent`, optional `tracestate`) carried with the message.
///
/// The worker makes a received message's trace context current while it is handled, and the bus
/// stamps it on every message dispatched meanwhile, so a chain of messages stays one trace.
/// With a [`TracePropagator`](crate::TracePropagator) installed (`courier-otel`), the bus stamps
/// the context of its `send` span instead, a child of the current span (or of the stamp the
/// envelope carried, when no span is current), and the worker's `process` span is parented on
/// it. Without one, to start a trace from your own context, add this stamp when dispatching (e.g.
/// from your propagator's `traceparent`), or dispatch inside
/// [`with_trace_context`](crate::with_trace_context). See [`trace`](crate::trace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContextStamp {
    /// The W3C `traceparent` header value.
    pub traceparent: String,
    /// The W3C `tracestate` header value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl Stamp for TraceContextStamp {
    const NAME: &'static str = "trace-context";
}

/// Which delivery of the message this envelope is (row delivery id, AMQP delivery tag). Local.
///
/// A transport that redelivers a message gives each delivery a new tag, so the late ack of a
/// superseded delivery can be told apart from the ack of the live one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeliveryTagStamp(pub String);

impl Stamp for DeliveryTagStamp {
    const NAME: &'static str = "delivery-tag";
    const SENDABLE: bool = false;
}

/// Send this message only if no message with the same `key` was sent within `ttl` (Symfony's
/// `DeduplicateStamp`). Local: the bus checks it before sending, against the target transport's
/// deduplication store ([`Abilities::deduplicate`](crate::Abilities::deduplicate)) or the
/// bus's own ([`MessageBusBuilder::deduplicate_store`](crate::MessageBusBuilder::deduplicate_store)).
/// A duplicate is not sent: the envelope [`dispatch`](crate::MessageBus::dispatch) returns
/// carries a [`DeduplicatedStamp`] instead of a [`SentStamp`]. The key is held for `ttl` from
/// the first send (not released when the message is handled); a send that fails releases it.
/// On SQL the key is taken in the transaction that inserts the message (`dispatch_in`: the
/// caller's), so it exists exactly when the message does; expired keys are pruned by the
/// transport, expire by themselves on Redis.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeduplicateStamp {
    /// The deduplication key (at most 190 bytes on SQL).
    pub key: String,
    /// How long the key stays taken.
    #[serde(with = "wire::millis")]
    pub ttl: Duration,
}

impl DeduplicateStamp {
    /// A stamp for `key`, held for `ttl`.
    #[must_use]
    pub fn new(key: impl Into<String>, ttl: Duration) -> Self {
        Self {
            key: key.into(),
            ttl,
        }
    }
}

impl Stamp for DeduplicateStamp {
    const NAME: &'static str = "deduplicate";
    const SENDABLE: bool = false;
}

/// The message was not sent to `transport`: a message with the same key was sent within its
/// TTL. Local; on the envelope [`dispatch`](crate::MessageBus::dispatch) returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeduplicatedStamp {
    /// The key.
    pub key: String,
    /// The transport it was not sent to (empty when deduplicated before local handling).
    pub transport: String,
}

impl Stamp for DeduplicatedStamp {
    const NAME: &'static str = "deduplicated";
    const SENDABLE: bool = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_details_keep_first_and_last_ten_causes() {
        let chain: Vec<String> = (0..25).map(|i| format!("cause {i}")).collect();
        let d = ErrorDetailsStamp::new("x", "boom", chain);
        assert_eq!(d.chain.len(), 11);
        assert_eq!(d.chain[0], "cause 0");
        assert_eq!(d.chain[1], "cause 15");
        assert_eq!(d.chain[10], "cause 24");
    }

    #[test]
    fn error_details_cut_long_text_on_a_char_boundary() {
        let d = ErrorDetailsStamp::new("x", "é".repeat(5000), vec![]);
        assert!(d.message.len() <= ErrorDetailsStamp::MAX_TEXT + '…'.len_utf8());
        assert!(d.message.ends_with('…'));
    }

    #[test]
    fn delay_stamp_travels_as_milliseconds() {
        let json =
            serde_json::to_string(&DelayStamp(Duration::from_millis(1500))).unwrap_or_default();
        assert_eq!(json, "1500");
    }
}
