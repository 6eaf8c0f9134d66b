//! The shared conformance suite against a real RabbitMQ.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use common::harness;

courier_test::conformance_suite!(
    harness,
    ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"
);
