//! Signed messages on Redis: entries written with the raw driver with a changed body, a
//! changed stamp header, no signature, or a signature by an unknown key end in the failure
//! transport with the reason named; entries signed before a key rotation still verify.

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis: set COURIER_TEST_REDIS_URL"]
async fn redis_tampered_unsigned_and_unknown_key_messages_end_in_the_failure_transport() {
    let h = common::harness().await;
    courier_test::signing::tampered_messages_end_in_the_failure_transport(&h).await;
}
