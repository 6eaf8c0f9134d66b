//! The shared conformance suite against the real Redis server.

mod common;

use common::harness;

courier_test::conformance_suite!(harness, ignore = "needs redis: set COURIER_TEST_REDIS_URL");
