//! The README's and the book's Rust blocks, compiled (and run unless `no_run`) as doctests:
//! one item per file. `tests/docs.rs` fails when a file with a Rust block is missing here or in
//! `crates/courier-cli/src/doctests.rs` (the pages whose blocks build a binary with `courier_cli::App`).

#[doc = include_str!("../docs/src/getting-started/first-worker.md")]
struct FirstWorker;

#[doc = include_str!("../docs/src/guides/testing.md")]
struct Testing;

#[doc = include_str!("../docs/src/guides/runs.md")]
struct Runs;

#[doc = include_str!("../docs/src/guides/agents.md")]
struct Agents;

#[doc = include_str!("../docs/src/guides/flow-control.md")]
struct FlowControl;

#[doc = include_str!("../docs/src/guides/queries-batches.md")]
struct QueriesBatches;

#[doc = include_str!("../docs/src/guides/outbox.md")]
struct Outbox;

#[doc = include_str!("../docs/src/guides/deduplication.md")]
struct Deduplication;

#[doc = include_str!("../docs/src/guides/signing-serializers.md")]
struct SigningSerializers;

#[doc = include_str!("../docs/src/guides/routing.md")]
struct Routing;

#[doc = include_str!("../docs/src/guides/retries.md")]
struct Retries;

#[doc = include_str!("../docs/src/guides/embedding.md")]
struct Embedding;

#[doc = include_str!("../docs/src/guides/custom-transport.md")]
struct CustomTransport;

#[doc = include_str!("../docs/src/operations/observability.md")]
struct Observability;

#[doc = include_str!("../docs/src/symfony.md")]
struct Symfony;
