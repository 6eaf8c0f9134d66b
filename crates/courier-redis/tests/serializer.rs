//! MessagePack bodies on Redis (`serializer=msgpack`): every stamp kind survives the round
//! trip, and a stream holding JSON and MessagePack entries is consumed whole.

mod common;

use std::sync::Arc;

use common::RedisHarness;
use courier_core::{Encoded, Serializer, Transport, async_trait};
use courier_test::{Harness, conformance, serializer};

/// The Redis harness with transports writing MessagePack.
struct Msgpack(RedisHarness);

#[async_trait]
impl Harness for Msgpack {
    async fn transport(&self) -> Arc<dyn Transport> {
        let stream = courier_test::env::unique_name("courier_msgpack");
        let options = self.0.options(&stream).serializer(Serializer::MessagePack);
        self.0.with_options(options).await
    }
    async fn expire_deliveries(&self, t: &Arc<dyn Transport>) {
        self.0.expire_deliveries(t).await;
    }
    async fn send_raw(&self, t: &Arc<dyn Transport>, encoded: Encoded) {
        self.0.send_raw(t, encoded).await;
    }
    fn poll_window(&self) -> std::time::Duration {
        self.0.poll_window()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn redis_msgpack_round_trip_and_mixed_stream() {
    let h = Msgpack(RedisHarness::new());
    conformance::round_trip(&h).await;
    serializer::json_and_msgpack_producers_are_both_consumed(&h).await;
}
