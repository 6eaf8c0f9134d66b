//! A transport in about 100 lines (messages in a `Mutex<BTreeMap>`, kept in wire form), proven by
//! running the shared conformance suite against it. `cargo run --example custom_transport`
//!
//! All its author reads: the [`Transport`] trait (Symfony's verbs: `send`, `get`, `ack`,
//! `reject`, with batch forms the defaults cover), the [`Abilities`] it offers beyond them (each
//! a trait of its own: here [`MessageCount`]), the [`Capabilities`] it declares (here a
//! redelivery window), and the conformance suite in `courier-test`.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use courier::{
    Abilities, Capabilities, DeliveryTagStamp, Encoded, Envelope, MessageCount, MessageRegistry,
    Transport, TransportError, TransportErrorKind, TransportMessageIdStamp, async_trait,
};
use courier_test::{Harness, conformance};

/// One stored message: its wire form and the tag of its live delivery, if any.
struct Row {
    wire: Encoded,
    delivery: Option<u64>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    next_tag: u64,
    rows: BTreeMap<u64, Row>,
}

/// Keeps messages in memory, in id order; no delays, no priorities.
struct MapTransport {
    registry: Arc<MessageRegistry>,
    state: Mutex<State>,
}

impl std::fmt::Debug for MapTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapTransport")
    }
}

impl MapTransport {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn store(&self, wire: Encoded) -> u64 {
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        st.rows.insert(
            id,
            Row {
                wire,
                delivery: None,
            },
        );
        id
    }

    /// Forgets every live delivery, as if its consumer died (the redelivery window).
    fn expire(&self) {
        self.lock()
            .rows
            .values_mut()
            .for_each(|r| r.delivery = None);
    }

    /// Removes the row if `envelope` is its live delivery.
    fn remove_live(&self, envelope: &Envelope) {
        let id = envelope.id().and_then(|i| i.parse::<u64>().ok());
        let tag = envelope
            .last::<DeliveryTagStamp>()
            .and_then(|t| t.0.parse::<u64>().ok());
        let mut st = self.lock();
        if let (Some(id), Some(tag)) = (id, tag)
            && st.rows.get(&id).is_some_and(|r| r.delivery == Some(tag))
        {
            st.rows.remove(&id);
        }
    }
}

#[async_trait]
impl Transport for MapTransport {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.capabilities().check_delay("map", &envelope)?;
        let wire = courier::encode(&envelope)
            .map_err(|e| TransportError::new(TransportErrorKind::Encode, "map").with_source(e))?;
        let id = self.store(wire);
        Ok(envelope.with(TransportMessageIdStamp(id.to_string())))
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        let mut st = self.lock();
        let ids: Vec<u64> = st
            .rows
            .iter()
            .filter(|(_, r)| r.delivery.is_none())
            .map(|(id, _)| *id)
            .take(max)
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            st.next_tag += 1;
            let tag = st.next_tag;
            let Some(row) = st.rows.get_mut(&id) else {
                continue;
            };
            row.delivery = Some(tag);
            let envelope = self.registry.decode(row.wire.clone());
            out.push(
                envelope
                    .with(TransportMessageIdStamp(id.to_string()))
                    .with(DeliveryTagStamp(tag.to_string())),
            );
        }
        Ok(out)
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_live(envelope);
        Ok(())
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.remove_live(envelope);
        Ok(())
    }

    /// The optional abilities: the one extension point beside the verbs.
    fn abilities(&self) -> Abilities<'_> {
        Abilities::none().message_count(self)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none().with_redelivery()
    }
}

#[async_trait]
impl MessageCount for MapTransport {
    async fn message_count(&self) -> Result<u64, TransportError> {
        Ok(self.lock().rows.len() as u64)
    }
}

/// What the conformance suite needs beyond the `Transport` trait.
struct MapHarness(Mutex<Vec<Arc<MapTransport>>>);

impl MapHarness {
    fn find(&self, t: &Arc<dyn Transport>) -> Option<Arc<MapTransport>> {
        let created = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        created
            .iter()
            .find(|c| Arc::as_ptr(c).cast::<()>() == Arc::as_ptr(t).cast::<()>())
            .cloned()
    }
}

#[async_trait]
impl Harness for MapHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        let t = Arc::new(MapTransport {
            registry: courier_test::registry(),
            state: Mutex::default(),
        });
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(t.clone());
        t
    }
    async fn expire_deliveries(&self, t: &Arc<dyn Transport>) {
        if let Some(m) = self.find(t) {
            m.expire();
        }
    }
    async fn send_raw(&self, t: &Arc<dyn Transport>, encoded: Encoded) {
        if let Some(m) = self.find(t) {
            m.store(encoded);
        }
    }
}

#[tokio::main]
async fn main() {
    let h = MapHarness(Mutex::default());
    conformance::run_all(&h).await;
    println!("MapTransport passes the conformance suite");
}
