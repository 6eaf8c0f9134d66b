//! The conformance suite on SQLite (a file in a temp dir; no server needed).
#![cfg(feature = "sqlite")]

mod common;

courier_test::conformance_suite!(common::sqlite);
