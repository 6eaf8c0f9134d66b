//! A hook on send (Messenger's `SendMessageToTransportsEvent`): it sees every message the bus is
//! about to send, with the transports it goes to, and may add stamps to it first.
//!
//! ```
//! use courier_core::{InMemoryTransport, Message, MessageBus, PriorityStamp, Sending};
//! use serde::{Deserialize, Serialize};
//! use std::sync::{Arc, Mutex};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Invoice { id: u32 }
//! impl Message for Invoice { const NAME: &'static str = "billing.invoice"; }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let queue = Arc::new(InMemoryTransport::new());
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! let bus = MessageBus::builder()
//!     .transport("async", queue.clone())
//!     .route("billing.*", ["async"])
//!     .on_send(move |sending: &mut Sending<'_>| {
//!         log.lock().unwrap().push(sending.transports().to_vec());
//!         sending.add_stamp(PriorityStamp(5));
//!     })
//!     .build();
//! bus.dispatch(Invoice { id: 1 }).await?;
//! assert_eq!(*seen.lock().unwrap(), [vec!["async".to_owned()]]);
//! assert_eq!(queue.sent()[0].last::<PriorityStamp>(), Some(&PriorityStamp(5)));
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```

use std::sync::Arc;

use crate::{Envelope, Stamp};

/// A message about to be sent, as a [`SendHook`] sees it.
#[derive(Debug)]
pub struct Sending<'a> {
    envelope: Envelope,
    transports: &'a [String],
}

impl<'a> Sending<'a> {
    pub(crate) fn new(envelope: Envelope, transports: &'a [String]) -> Self {
        Self {
            envelope,
            transports,
        }
    }

    /// The message with its stamps (including the ones added so far).
    #[must_use]
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The transports it is sent to, in order.
    #[must_use]
    pub fn transports(&self) -> &[String] {
        self.transports
    }

    /// Adds a stamp to what is sent (to every transport).
    pub fn add_stamp<S: Stamp>(&mut self, stamp: S) {
        self.envelope = self.envelope.clone().with(stamp);
    }

    pub(crate) fn into_envelope(self) -> Envelope {
        self.envelope
    }
}

/// A hook called with every message the bus sends to transports, before it is sent; hooks run
/// in the order added ([`MessageBusBuilder::on_send`](crate::MessageBusBuilder::on_send)).
pub type SendHook = Arc<dyn Fn(&mut Sending<'_>) + Send + Sync>;
