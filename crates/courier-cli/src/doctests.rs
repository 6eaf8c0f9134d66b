//! The README's and the book's Rust blocks that build a binary of one's own with
//! [`App`](crate::App), compiled (and run unless `no_run`) as doctests of this package, which has
//! both `courier` and `courier_cli`: one item per file (the others are the facade's,
//! `src/doctests.rs`). `tests/docs.rs` fails when a file with a Rust block is in neither.

#[doc = include_str!("../../../README.md")]
struct Readme;

#[doc = include_str!("../../../docs/src/getting-started/postgres.md")]
struct Postgres;
