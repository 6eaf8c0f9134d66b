//! The conformance suite on PostgreSQL.
#![cfg(feature = "postgres")]

mod common;

courier_test::conformance_suite!(
    common::postgres,
    ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"
);
