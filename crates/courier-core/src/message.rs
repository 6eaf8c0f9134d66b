//! Messages: the payloads a bus dispatches and a transport carries.

use std::any::Any;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A message that can travel through a bus and over any transport.
///
/// The wire name ([`Message::NAME`]) is what identifies the message on the wire and in routing.
/// It must be stable across releases and languages: never derive it from the Rust type path.
///
/// ```
/// use courier_core::Message;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct SendInvoice { invoice_id: u64 }
///
/// impl Message for SendInvoice {
///     const NAME: &'static str = "billing.send_invoice";
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier message",
    note = "implement `courier::Message` for `{Self}` with a stable wire name (`const NAME: &'static str`)"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable wire name, e.g. `"courier.run_agent"`.
    const NAME: &'static str;

    /// The message's own uniqueness key and period, if it has one (default: none). The bus
    /// deduplicates a message that returns one as if it had been dispatched with that
    /// [`DeduplicateStamp`](crate::DeduplicateStamp); a stamp given at dispatch wins over it.
    ///
    /// ```
    /// use courier_core::{DeduplicateStamp, Message};
    /// use serde::{Deserialize, Serialize};
    /// use std::time::Duration;
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SendInvoice { invoice_id: u64 }
    ///
    /// impl Message for SendInvoice {
    ///     const NAME: &'static str = "billing.send_invoice";
    ///
    ///     // One invoice mail per invoice and hour, however often it is dispatched.
    ///     fn deduplicate(&self) -> Option<DeduplicateStamp> {
    ///         let key = format!("invoice:{}", self.invoice_id);
    ///         Some(DeduplicateStamp::new(key, Duration::from_secs(3600)))
    ///     }
    /// }
    /// ```
    fn deduplicate(&self) -> Option<crate::DeduplicateStamp> {
        None
    }
}

/// A type-erased message as held by an [`Envelope`](crate::Envelope).
pub(crate) trait AnyMessage: Any + Send + Sync {
    /// Appends the message as JSON.
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error>;
    /// Appends the message as a MessagePack map (field names kept).
    fn encode_msgpack_into(&self, out: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error>;
    fn as_any(&self) -> &dyn Any;
    /// [`Message::deduplicate`].
    fn deduplicate(&self) -> Option<crate::DeduplicateStamp>;
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<M: Message> AnyMessage for M {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(out, self)
    }
    fn encode_msgpack_into(&self, out: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error> {
        rmp_serde::encode::write_named(out, self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn deduplicate(&self) -> Option<crate::DeduplicateStamp> {
        Message::deduplicate(self)
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
