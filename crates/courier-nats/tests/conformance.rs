//! The shared conformance suite against a real NATS server with JetStream.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use common::harness;

courier_test::conformance_suite!(harness, ignore = "needs nats: set COURIER_TEST_NATS_URL");
