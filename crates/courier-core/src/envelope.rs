//! The envelope: a message plus its stamps.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;

use crate::message::AnyMessage;
use crate::stamp::{AnyStamp, ErrorDetailsStamp, TransportMessageIdStamp, keep_first_and_last};
use crate::{DecodeError, Message, Stamp};

/// What an envelope carries: a typed message, or the raw bytes of one that could not be decoded.
#[derive(Clone)]
pub(crate) enum Payload {
    Typed {
        name: &'static str,
        message: Arc<dyn AnyMessage>,
        /// The body as it was read from the wire, reused verbatim when the envelope is sent again.
        body: Option<Arc<str>>,
    },
    Undecodable {
        name: Option<Arc<str>>,
        /// The body's bytes as stored (not necessarily UTF-8).
        body: Arc<[u8]>,
        error: Arc<DecodeError>,
        /// What else of the wire form must survive a move to another transport.
        raw: Arc<crate::codec::RawParts>,
    },
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payload::Typed { name, .. } => write!(f, "{name}"),
            Payload::Undecodable { name, error, .. } => {
                write!(
                    f,
                    "undecodable {:?} ({error})",
                    name.as_deref().unwrap_or("?")
                )
            }
        }
    }
}

/// A stamp slot: typed when added in this process, raw JSON when read from the wire (decoded to
/// its type on first access and cached).
#[derive(Clone)]
pub(crate) enum Slot {
    Typed(Arc<dyn AnyStamp>),
    Raw(Arc<RawSlot>),
}

pub(crate) struct RawSlot {
    pub(crate) name: Box<str>,
    pub(crate) json: Box<RawValue>,
    decoded: OnceLock<Option<Arc<dyn AnyStamp>>>,
}

impl RawSlot {
    pub(crate) fn new(name: &str, json: Box<RawValue>) -> Self {
        Self {
            name: name.into(),
            json,
            decoded: OnceLock::new(),
        }
    }
}

impl Slot {
    fn name(&self) -> &str {
        match self {
            Slot::Typed(s) => s.name(),
            Slot::Raw(r) => &r.name,
        }
    }

    fn get<S: Stamp>(&self) -> Option<&S> {
        match self {
            Slot::Typed(s) => s.as_any().downcast_ref::<S>(),
            Slot::Raw(r) if &*r.name == S::NAME => r
                .decoded
                .get_or_init(|| {
                    serde_json::from_str::<S>(r.json.get())
                        .ok()
                        .map(|s| Arc::new(s) as Arc<dyn AnyStamp>)
                })
                .as_ref()
                .and_then(|s| s.as_any().downcast_ref::<S>()),
            Slot::Raw(_) => None,
        }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slot::Typed(s) => s.fmt(f),
            Slot::Raw(r) => write!(f, "{}({})", r.name, r.json.get()),
        }
    }
}

/// A message with its stamps: what a bus dispatches and a transport carries.
///
/// Envelopes are values: every `with*` method returns a new envelope and leaves the message
/// untouched. Cloning is cheap (the message and stamps are shared).
///
/// ```
/// use courier_core::{DelayStamp, Envelope, Message, PriorityStamp};
/// use serde::{Deserialize, Serialize};
/// use std::time::Duration;
///
/// #[derive(Serialize, Deserialize)]
/// struct Ping;
/// impl Message for Ping { const NAME: &'static str = "app.ping"; }
///
/// let envelope = Envelope::new(Ping)
///     .with(DelayStamp(Duration::from_secs(5)))
///     .with(PriorityStamp(1))
///     .with(PriorityStamp(9));
/// assert_eq!(envelope.last::<PriorityStamp>(), Some(&PriorityStamp(9)));
/// assert_eq!(envelope.all::<PriorityStamp>().count(), 2);
/// assert!(envelope.clone().without_all::<PriorityStamp>().last::<PriorityStamp>().is_none());
/// assert_eq!(envelope.message_name(), "app.ping");
/// ```
///
/// `Debug` shows the wire name and the stamps, never the message body.
#[derive(Clone)]
pub struct Envelope {
    pub(crate) payload: Payload,
    pub(crate) stamps: Vec<Slot>,
    /// Headers from the wire that are neither `type`, `content-type` nor a stamp; kept verbatim.
    pub(crate) extra_headers: Option<Arc<BTreeMap<String, String>>>,
}

impl Envelope {
    /// Wraps a message without stamps.
    pub fn new<M: Message>(message: M) -> Self {
        Self::from_arc(Arc::new(message))
    }

    /// Wraps a shared message without stamps.
    pub fn from_arc<M: Message>(message: Arc<M>) -> Self {
        Self {
            payload: Payload::Typed {
                name: M::NAME,
                message,
                body: None,
            },
            stamps: Vec::new(),
            extra_headers: None,
        }
    }

    /// The deduplication the envelope asks for: its [`DeduplicateStamp`](crate::DeduplicateStamp),
    /// else the message's own ([`Message::deduplicate`]).
    pub(crate) fn deduplication(&self) -> Option<crate::DeduplicateStamp> {
        if let Some(stamp) = self.last::<crate::DeduplicateStamp>() {
            return Some(stamp.clone());
        }
        match &self.payload {
            Payload::Typed { message, .. } => message.deduplicate(),
            Payload::Undecodable { .. } => None,
        }
    }

    /// The message, if it is an `M`.
    #[must_use]
    pub fn message<M: Message>(&self) -> Option<&M> {
        match &self.payload {
            Payload::Typed { message, .. } => message.as_any().downcast_ref::<M>(),
            Payload::Undecodable { .. } => None,
        }
    }

    /// The shared message, if it is an `M`.
    #[must_use]
    pub fn message_arc<M: Message>(&self) -> Option<Arc<M>> {
        match &self.payload {
            Payload::Typed { message, .. } => Arc::clone(message).into_any().downcast::<M>().ok(),
            Payload::Undecodable { .. } => None,
        }
    }

    /// The message's wire name (`"?"` for an undecodable message without a `type` header).
    #[must_use]
    pub fn message_name(&self) -> &str {
        match &self.payload {
            Payload::Typed { name, .. } => name,
            Payload::Undecodable { name, .. } => name.as_deref().unwrap_or("?"),
        }
    }

    /// Why the message could not be decoded, for an envelope read from the wire that carries no
    /// usable message. The worker moves such envelopes to the failure transport.
    #[must_use]
    pub fn decode_error(&self) -> Option<&DecodeError> {
        match &self.payload {
            Payload::Typed { .. } => None,
            Payload::Undecodable { error, .. } => Some(error),
        }
    }

    /// The body's bytes as they were stored, for an envelope whose message could not be
    /// decoded ([`Envelope::decode_error`]); they need not be UTF-8.
    #[must_use]
    pub fn undecodable_body(&self) -> Option<&[u8]> {
        match &self.payload {
            Payload::Typed { .. } => None,
            Payload::Undecodable { body, .. } => Some(body),
        }
    }

    /// Adds a stamp (after any of the same kind).
    #[must_use]
    pub fn with<S: Stamp>(mut self, stamp: S) -> Self {
        self.stamps.push(Slot::Typed(Arc::new(stamp)));
        self
    }

    /// Adds a stamp shared with other envelopes: one allocation for a whole batch, such as the
    /// delivery tag a transport gives every message of one claim.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use courier_core::{DeliveryTagStamp, Envelope, Message};
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct Ping;
    /// # impl Message for Ping { const NAME: &'static str = "app.ping"; }
    /// let tag = Arc::new(DeliveryTagStamp("42".into()));
    /// let batch: Vec<Envelope> = (0..3)
    ///     .map(|_| Envelope::new(Ping).with_arc(Arc::clone(&tag)))
    ///     .collect();
    /// assert!(batch.iter().all(|e| e.last::<DeliveryTagStamp>() == Some(&*tag)));
    /// ```
    #[must_use]
    pub fn with_arc<S: Stamp>(mut self, stamp: Arc<S>) -> Self {
        self.stamps.push(Slot::Typed(stamp));
        self
    }

    /// Adds a stamp shared with other envelopes (no allocation: the hot path's bus name,
    /// received and handled stamps).
    #[must_use]
    pub(crate) fn with_shared(mut self, stamp: &Arc<dyn AnyStamp>) -> Self {
        self.stamps.push(Slot::Typed(Arc::clone(stamp)));
        self
    }

    /// Adds error details, keeping only the first and the last ten [`ErrorDetailsStamp`]s so a
    /// message that fails again and again stays small.
    #[must_use]
    pub fn with_error_details(self, details: ErrorDetailsStamp) -> Self {
        let kept: Vec<ErrorDetailsStamp> = self.all::<ErrorDetailsStamp>().cloned().collect();
        let mut kept = keep_first_and_last(kept, ErrorDetailsStamp::KEEP_LAST - 1);
        kept.push(details);
        let mut env = self.without_all::<ErrorDetailsStamp>();
        for d in kept {
            env = env.with(d);
        }
        env
    }

    /// Removes every stamp of kind `S`.
    #[must_use]
    pub fn without_all<S: Stamp>(mut self) -> Self {
        self.stamps.retain(|s| s.name() != S::NAME);
        self
    }

    /// The last stamp of kind `S`.
    #[must_use]
    pub fn last<S: Stamp>(&self) -> Option<&S> {
        self.stamps.iter().rev().find_map(Slot::get::<S>)
    }

    /// Every stamp of kind `S`, oldest first.
    pub fn all<S: Stamp>(&self) -> impl DoubleEndedIterator<Item = &S> + '_ {
        self.stamps.iter().filter_map(Slot::get::<S>)
    }

    /// Whether the envelope has at least one stamp of kind `S`.
    #[must_use]
    pub fn has<S: Stamp>(&self) -> bool {
        self.stamps.iter().any(|s| s.name() == S::NAME)
    }

    /// The transport's id for this message ([`TransportMessageIdStamp`]), once sent or received.
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        self.last::<TransportMessageIdStamp>().map(|s| s.0.as_str())
    }

    /// The names of all stamps, in order (for diagnostics).
    pub fn stamp_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.stamps.iter().map(Slot::name)
    }

    /// Extra wire headers that are not stamps (kept verbatim from the producer).
    #[must_use]
    pub fn extra_headers(&self) -> Option<&BTreeMap<String, String>> {
        self.extra_headers.as_deref()
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("message", &self.payload)
            .field("stamps", &self.stamps)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DelayStamp, ReceivedStamp};
    use serde::{Deserialize, Serialize};
    use std::time::Duration;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Secret {
        password: String,
    }
    impl Message for Secret {
        const NAME: &'static str = "test.secret";
    }

    #[test]
    fn debug_shows_name_and_stamps_but_never_the_body() {
        let env = Envelope::new(Secret {
            password: "hunter2".into(),
        })
        .with(ReceivedStamp("async".into()));
        let s = format!("{env:?}");
        assert!(s.contains("test.secret") && s.contains("async"), "{s}");
        assert!(!s.contains("hunter2"), "{s}");
    }

    #[test]
    fn typed_access_reads_the_message_and_stamps() {
        let env = Envelope::new(Secret {
            password: "x".into(),
        })
        .with(DelayStamp(Duration::from_secs(1)));
        assert_eq!(
            env.message::<Secret>().map(|m| m.password.as_str()),
            Some("x")
        );
        assert_eq!(
            env.message_arc::<Secret>().map(|m| m.password.clone()),
            Some("x".to_string())
        );
        assert!(env.has::<DelayStamp>());
        assert!(!env.has::<ReceivedStamp>());
    }

    #[test]
    fn error_details_stamps_are_bounded_to_first_and_last_ten() {
        let mut env = Envelope::new(Secret {
            password: "x".into(),
        });
        for i in 0..30 {
            env = env.with_error_details(ErrorDetailsStamp::new("c", format!("e{i}"), vec![]));
        }
        let msgs: Vec<&str> = env
            .all::<ErrorDetailsStamp>()
            .map(|d| d.message.as_str())
            .collect();
        assert_eq!(msgs.len(), 11);
        assert_eq!(msgs[0], "e0");
        assert_eq!(msgs[1], "e20");
        assert_eq!(msgs[10], "e29");
    }
}
