//! Reaching a bus that does not exist yet: a [`BusLink`] for parts the bus holds, a
//! [`Dispatcher`] for producers outside it.

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};

use super::{BusInner, MessageBus};

/// Lets a transport built before its bus (such as [`SyncTransport`](crate::SyncTransport)) reach
/// the bus once it exists. The bus builder binds every link it is given. The link is weak: it is
/// for parts the bus itself holds (a transport), which must not keep the bus alive. Code outside
/// the bus uses a [`Dispatcher`]; a handler uses [`MessageBus::current`].
#[derive(Clone, Default)]
pub struct BusLink(Arc<OnceLock<Weak<BusInner>>>);

impl fmt::Debug for BusLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.get().is_some() {
            "BusLink(bound)"
        } else {
            "BusLink(unbound)"
        })
    }
}

impl BusLink {
    /// An unbound link.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds the link to `bus` (the first binding wins).
    pub fn bind(&self, bus: &MessageBus) {
        let _ = self.0.set(Arc::downgrade(&bus.inner));
    }

    /// The bus, if bound and still alive.
    #[must_use]
    pub fn get(&self) -> Option<MessageBus> {
        self.0
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| MessageBus { inner })
    }
}

/// The bus a producer outside the bus dispatches on, handed out before the bus exists: give it
/// to [`MessageBusBuilder::dispatcher`](super::MessageBusBuilder::dispatcher), and [`MessageBusBuilder::build`](super::MessageBusBuilder::build) fills it once. From
/// then on it holds the bus (a strong handle: the bus lives as long as a dispatcher does), so
/// a filled dispatcher never loses it. Never put one inside the bus it dispatches on (in a
/// handler or a transport): that is a cycle the bus is never freed from; a handler reaches its
/// bus with [`MessageBus::current`].
///
/// ```
/// use courier_core::{Dispatcher, MessageBus};
///
/// let dispatcher = Dispatcher::new();
/// assert!(dispatcher.bus().is_none());
/// let builder = MessageBus::builder().name("orders").dispatcher(&dispatcher);
/// drop(builder.build());
/// assert_eq!(dispatcher.bus().map(MessageBus::name), Some("orders"));
/// ```
#[derive(Clone, Default)]
pub struct Dispatcher(Arc<OnceLock<MessageBus>>);

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bus() {
            Some(bus) => write!(f, "Dispatcher({})", bus.name()),
            None => f.write_str("Dispatcher(unfilled)"),
        }
    }
}

impl Dispatcher {
    /// A dispatcher no bus has filled yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A dispatcher filled with `bus` already.
    #[must_use]
    pub fn of(bus: &MessageBus) -> Self {
        let d = Self::new();
        d.fill(bus);
        d
    }

    /// The bus, once built (`None` until the builder it was given to has built).
    #[must_use]
    pub fn bus(&self) -> Option<&MessageBus> {
        self.0.get()
    }

    pub(super) fn fill(&self, bus: &MessageBus) {
        // The first bus built wins: a dispatcher given to two builders dispatches on the first.
        let _ = self.0.set(bus.clone());
    }
}
