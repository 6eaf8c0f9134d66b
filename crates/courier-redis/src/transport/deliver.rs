//! Delivering: read entries turned into envelopes and remembered as in flight.

use std::sync::Arc;

use courier_core::{DeliveryTagStamp, Envelope, TransportMessageIdStamp};
use tokio::time::Instant;

use super::RedisTransport;
use crate::in_flight::{InFlight, StreamId};
use crate::reply::Entry;

impl RedisTransport {
    /// At most once per redelivery window, drops the entries not delivered or kept alive for a
    /// whole window: a worker that still holds one keeps it alive far more often, so such an
    /// entry was let go of (dropped without an ack, or left at shutdown) or claimed by another
    /// consumer, and would otherwise stay in the map (and in the recovery skip list) for good.
    fn prune_stale(&self, in_flight: &mut InFlight, now: Instant) {
        let window = self.options.redeliver_timeout;
        let mut next = self
            .next_prune
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now < *next {
            return;
        }
        *next = now + window;
        in_flight.retain(|_, (_, at)| now.saturating_duration_since(*at) < window);
    }

    /// Turns read entries into envelopes, remembering them as in flight since `requested_at`
    /// (a local time before the request that delivered them).
    pub(crate) fn deliver(&self, entries: Vec<Entry>, requested_at: Instant) -> Vec<Envelope> {
        let mut in_flight = self.in_flight();
        self.prune_stale(&mut in_flight, requested_at);
        let mut decoder = self.registry.json_decoder();
        entries
            .into_iter()
            .map(|e| {
                if let Some(id) = StreamId::parse(&e.id) {
                    in_flight.insert(id, (e.count, requested_at));
                }
                let tag = if e.count == 1 {
                    Arc::clone(&self.first_delivery)
                } else {
                    Arc::new(DeliveryTagStamp(e.count.to_string()))
                };
                decoder
                    .decode_bytes(e.body, e.headers.as_deref())
                    .with(TransportMessageIdStamp(e.id))
                    .with_arc(tag)
            })
            .collect()
    }
}
