//! The [`Transport`] contract of [`RedisTransport`]: each operation on a plain queue (the
//! stream) or handed to the keyed queue's (`keyed_ops.rs`).

use std::time::Duration;

use courier_core::{
    Capabilities, DelayStamp, Envelope, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp, async_trait,
};
use redis::Value;
use tokio::time::Instant;

use super::RedisTransport;
use super::send::delay_ms;
use super::settle::{Delivery, delivery};
use crate::reply;

#[async_trait]
impl Transport for RedisTransport {
    fn messaging_system(&self) -> &'static str {
        "redis"
    }

    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        let mut sent = self.send_batch(vec![envelope]).await?;
        sent.pop().ok_or_else(|| {
            TransportError::new(TransportErrorKind::Protocol, self.options.name.clone())
        })
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if self.keyed.is_some() {
            return self.keyed_read(max).await;
        }
        self.read(max).await
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.ack_batch(std::slice::from_ref(envelope)).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self
                .keyed_settle(std::slice::from_ref(envelope), "cannot reject")
                .await;
        }
        self.remove_deliveries(std::slice::from_ref(envelope), "cannot reject")
            .await
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_retry(envelope, delay).await;
        }
        let Some(Delivery {
            id,
            stream_id,
            count,
            ..
        }) = delivery(&envelope)
        else {
            let next = envelope.without_all::<DelayStamp>();
            let next = if delay.is_zero() {
                next
            } else {
                next.with(DelayStamp(delay))
            };
            return self.send(next).await.map(drop);
        };
        let (id, count) = (id.to_owned(), count.to_owned());
        let next = envelope.without_all::<DelayStamp>();
        let next = if delay.is_zero() {
            next
        } else {
            next.with(DelayStamp(delay))
        };
        self.capabilities().check_delay(&self.options.name, &next)?;
        let encoded = courier_core::encode_json_with(&next, self.options.serializer)
            .map_err(|e| self.encode_error(e))?;
        let delayed_id = format!("d-{:032x}", fastrand::u128(..));
        let mut cmd = self.scripts.retry.cmd(&[
            &self.options.stream,
            &self.delayed_key,
            &self.delayed_data_key,
        ]);
        cmd.arg(&self.options.group)
            .arg(&self.options.consumer)
            .arg(&id)
            .arg(&count)
            .arg(if self.options.delete_after_ack {
                "1"
            } else {
                "0"
            })
            .arg(delay_ms(delay))
            .arg(&delayed_id)
            .arg(&encoded.headers)
            .arg(&encoded.body)
            .arg(&self.maxlen);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).ignore();
        self.query::<()>(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot retry"))?;
        if !delay.is_zero() {
            self.hint_due(delay);
        }
        if let Some(id) = stream_id {
            self.in_flight().remove(&id);
        }
        Ok(())
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.keepalive_batch(std::slice::from_ref(envelope)).await
    }

    /// Resets the idle time of every delivery that is still this consumer's, in one round trip.
    async fn keepalive_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_keepalive(envelopes).await;
        }
        let deliveries: Vec<Delivery<'_>> = envelopes.iter().filter_map(delivery).collect();
        if deliveries.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for d in &deliveries {
            let mut cmd = self.scripts.keepalive.cmd(&[&self.options.stream]);
            cmd.arg(&self.options.group)
                .arg(&self.options.consumer)
                .arg(d.id)
                .arg(d.count);
            pipe.add_command(cmd);
        }
        let requested_at = Instant::now();
        let kept: Vec<u64> = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot keep alive"))?;
        let mut in_flight = self.in_flight();
        for (d, kept) in deliveries.iter().zip(kept) {
            let Some(id) = d.stream_id else { continue };
            let Some(entry) = in_flight.get_mut(&id) else {
                continue;
            };
            if d.count.parse() != Ok(entry.0) {
                continue;
            }
            if kept == 1 {
                entry.1 = requested_at;
            } else {
                // Another consumer claimed it (or it is gone): no longer ours to hold.
                in_flight.remove(&id);
            }
        }
        Ok(())
    }

    async fn send_batch(&self, envelopes: Vec<Envelope>) -> Result<Vec<Envelope>, TransportError> {
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        if self.keyed.is_some() {
            return self.keyed_send_batch(envelopes).await;
        }
        let mut pipe = redis::Pipeline::with_capacity(envelopes.len());
        let known = self.add_sends(&mut pipe, &envelopes)?;
        let replies: Vec<Value> = self
            .query(&pipe)
            .await
            .map_err(|e| self.error(e, "cannot send"))?;
        if replies.len() != envelopes.len() {
            return Err(TransportError::new(
                TransportErrorKind::Protocol,
                self.options.name.clone(),
            )
            .with_context("unexpected reply to XADD"));
        }
        envelopes
            .into_iter()
            .zip(known)
            .zip(replies)
            .map(|((envelope, known), reply)| {
                let id = known.or_else(|| reply::into_text(reply)).ok_or_else(|| {
                    TransportError::new(TransportErrorKind::Protocol, self.options.name.clone())
                        .with_context("XADD returned no id")
                })?;
                Ok(envelope.with(TransportMessageIdStamp(id)))
            })
            .collect()
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if self.keyed.is_some() {
            return self.keyed_settle(envelopes, "cannot ack").await;
        }
        self.remove_deliveries(envelopes, "cannot ack").await
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.setup = Some(self);
        abilities.listable = Some(self);
        abilities.schedule_store = Some(self);
        abilities.pausable = Some(self);
        abilities.rate_limiter = Some(self);
        abilities.worker_registry = Some(self);
        abilities.message_count = Some(self);
        abilities.deduplicate = Some(self);
        abilities.keyed_queue = self
            .keyed
            .is_some()
            .then_some(self as &dyn courier_core::KeyedQueue);
        abilities.any = Some(self);
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
            .with_delay(None)
            .with_get_wait(self.options.poll_window)
            .with_redeliver_after(self.options.redeliver_timeout)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::RedisOptions;
    use courier_test::TestMessage;
    use redis::Client;

    /// A short redelivery window, so another consumer claims a delivery quickly.
    const WINDOW: Duration = Duration::from_millis(300);
    const OP: Duration = Duration::from_secs(10);

    async fn consumer(stream: &str, name: &str) -> RedisTransport {
        let options = RedisOptions::default()
            .stream(stream)
            .consumer(name)
            .redeliver_timeout(WINDOW)
            .claim_interval(Some(Duration::from_millis(20)))
            .poll_window(Duration::from_millis(100));
        let url = courier_test::env::redis_url();
        tokio::time::timeout(
            OP,
            RedisTransport::connect(&url, options, courier_test::registry()),
        )
        .await
        .unwrap()
        .unwrap()
    }

    async fn get_one(t: &RedisTransport) -> Envelope {
        let deadline = Instant::now() + OP;
        loop {
            let mut got = tokio::time::timeout(OP, t.get(1)).await.unwrap().unwrap();
            if let Some(e) = got.pop() {
                return e;
            }
            assert!(Instant::now() < deadline, "nothing delivered");
        }
    }

    async fn drop_keys(t: &RedisTransport) {
        let client = Client::open(courier_test::env::redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("DEL")
            .arg(&t.options.stream)
            .arg(&t.delayed_key)
            .arg(&t.delayed_data_key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
    async fn a_keepalive_that_finds_a_delivery_claimed_by_another_consumer_forgets_it() {
        let stream = courier_test::env::unique_name("courier_inflight_claimed");
        let (a, b) = (consumer(&stream, "a").await, consumer(&stream, "b").await);
        a.send(Envelope::new(TestMessage::new(1))).await.unwrap();
        let held = get_one(&a).await;
        assert_eq!(a.in_flight().len(), 1);
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        let claimed = get_one(&b).await;
        assert_eq!(
            claimed.message::<TestMessage>().map(|m| m.seq),
            Some(1),
            "b claims a's stale delivery"
        );
        a.keepalive(&held).await.unwrap();
        assert_eq!(a.in_flight().len(), 0, "a no longer holds what b claimed");
        b.ack(&claimed).await.unwrap();
        drop_keys(&a).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
    async fn deliveries_let_go_of_for_a_whole_window_leave_the_in_flight_map() {
        let stream = courier_test::env::unique_name("courier_inflight_stale");
        let (a, b) = (consumer(&stream, "a").await, consumer(&stream, "b").await);
        a.send(Envelope::new(TestMessage::new(1))).await.unwrap();
        let _dropped = get_one(&a).await; // never acked nor kept alive
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        let claimed = get_one(&b).await;
        b.ack(&claimed).await.unwrap();
        a.send(Envelope::new(TestMessage::new(2))).await.unwrap();
        let second = get_one(&a).await;
        assert_eq!(second.message::<TestMessage>().map(|m| m.seq), Some(2));
        assert_eq!(a.in_flight().len(), 1, "only the live delivery is left");
        a.ack(&second).await.unwrap();
        assert_eq!(a.in_flight().len(), 0);
        drop_keys(&a).await;
    }
}
