//! Acking and rejecting: which deliveries are still ours, and the pipeline that removes them.

use courier_core::{DeliveryTagStamp, Envelope, TransportError, TransportMessageIdStamp};
use tokio::time::Instant;

use super::RedisTransport;
use crate::in_flight::{InFlight, StreamId};

/// Ids per `ack` script call (Lua's `unpack` has a limit).
const ACK_CHUNK: usize = 1000;

/// How an operation names the delivery it acts on.
pub(super) struct Delivery<'a> {
    pub(super) id: &'a str,
    /// `id` parsed; `None` only for an id the server did not write.
    pub(super) stream_id: Option<StreamId>,
    pub(super) count: &'a str,
    /// Certainly still ours (see [`RedisTransport::is_fresh`]): acked without a check.
    pub(super) fresh: bool,
}

pub(super) fn delivery(envelope: &Envelope) -> Option<Delivery<'_>> {
    let id = envelope.last::<TransportMessageIdStamp>()?.0.as_str();
    if is_delayed_id(id) {
        return None;
    }
    let count = envelope
        .last::<DeliveryTagStamp>()
        .map_or("", |t| t.0.as_str());
    Some(Delivery {
        id,
        stream_id: StreamId::parse(id),
        count,
        fresh: false,
    })
}

pub(crate) fn is_delayed_id(id: &str) -> bool {
    id.starts_with("d-")
}

impl RedisTransport {
    /// Whether a delivery is certainly still ours: it is this process's live delivery (same
    /// count) and it was delivered or kept alive less than half the redelivery window ago, so
    /// `XAUTOCLAIM` (which needs the full window of server-side idle time, counted from a moment
    /// after our local timestamp) cannot have handed it to anyone yet.
    fn is_fresh(&self, in_flight: &InFlight, now: Instant, d: &Delivery<'_>) -> bool {
        let entry = d.stream_id.and_then(|id| in_flight.get(&id));
        entry.is_some_and(|(count, at)| {
            d.count.parse() == Ok(*count)
                && now.saturating_duration_since(*at) < self.options.redeliver_timeout / 2
        })
    }

    /// Acks (and deletes) deliveries in one round trip: fresh ones with plain `XACK` + `XDEL`,
    /// the others through the ack script, which checks ownership on the server.
    fn ack_pipeline(&self, deliveries: &mut [Delivery<'_>]) -> redis::Pipeline {
        let now = Instant::now();
        let (mut fresh, mut fresh_bytes) = (0, 0);
        {
            let in_flight = self.in_flight();
            for d in deliveries.iter_mut() {
                d.fresh = self.is_fresh(&in_flight, now, d);
                if d.fresh {
                    fresh += 1;
                    fresh_bytes += d.id.len();
                }
            }
        }
        let mut pipe = redis::Pipeline::with_capacity(3);
        if fresh > 0 {
            let (stream, group) = (&self.options.stream, &self.options.group);
            let mut xack =
                redis::Cmd::with_capacity(3 + fresh, 4 + stream.len() + group.len() + fresh_bytes);
            xack.arg("XACK").arg(stream).arg(group);
            let mut xdel = self.options.delete_after_ack.then(|| {
                let mut xdel = redis::Cmd::with_capacity(2 + fresh, 4 + stream.len() + fresh_bytes);
                xdel.arg("XDEL").arg(stream);
                xdel
            });
            for d in deliveries.iter().filter(|d| d.fresh) {
                xack.arg(d.id);
                if let Some(xdel) = &mut xdel {
                    xdel.arg(d.id);
                }
            }
            pipe.add_command(xack).ignore();
            if let Some(xdel) = xdel {
                pipe.add_command(xdel).ignore();
            }
        }
        let delete = if self.options.delete_after_ack {
            "1"
        } else {
            "0"
        };
        // Rare: deliveries kept past half the redelivery window, or not from this process.
        let checked: Vec<&Delivery<'_>> = deliveries.iter().filter(|d| !d.fresh).collect();
        for chunk in checked.chunks(ACK_CHUNK) {
            let mut cmd = self.scripts.ack.cmd(&[&self.options.stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(delete);
            for d in chunk {
                cmd.arg(d.id).arg(d.count);
            }
            pipe.add_command(cmd).ignore();
        }
        pipe
    }

    pub(super) async fn remove_deliveries(
        &self,
        envelopes: &[Envelope],
        context: &'static str,
    ) -> Result<(), TransportError> {
        let mut deliveries: Vec<Delivery<'_>> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        self.query::<()>(&self.ack_pipeline(&mut deliveries))
            .await
            .map_err(|e| self.error(e, context))?;
        let mut in_flight = self.in_flight();
        for id in deliveries.iter().filter_map(|d| d.stream_id) {
            in_flight.remove(&id);
        }
        Ok(())
    }
}
