//! The conformance suite on MariaDB / MySQL.
#![cfg(feature = "mysql")]

mod common;

courier_test::conformance_suite!(
    common::mysql,
    ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"
);
