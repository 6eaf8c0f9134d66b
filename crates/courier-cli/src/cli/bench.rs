//! The arguments of `courier bench`.

use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Transport to measure (default: a fresh SQLite file in the temp directory)
    #[arg(long)]
    pub(crate) dsn: Option<String>,
    /// Messages to send and consume (default 20,000); with --runs, runs to execute (default
    /// 1,000)
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) messages: Option<u64>,
    /// Handlers running at once
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) concurrency: u16,
    /// Message body size in bytes
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    pub(crate) size: u64,
    /// Messages fetched (and sent) per round trip
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) fetch_size: u16,
    /// Also measure the raw driver doing the same protocol work
    #[arg(long)]
    pub(crate) raw: bool,
    /// Measurement rounds, alternating the two sides (--raw, --concurrency-keys; default 3 with
    /// either, else 1); medians are reported. Not with --latency, whose samples alternate
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=20), conflicts_with = "latency")]
    pub(crate) rounds: Option<u8>,
    /// Measure durable runs: scripted runs of 3 no-op steps executed by --workers workers
    /// (runs/s, store statements per run)
    #[arg(long, conflicts_with_all = ["latency", "raw"])]
    pub(crate) runs: bool,
    /// In-process workers on the same bus (with --runs)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) workers: u16,
    /// With --runs: measure durable steps instead: --messages runs (default 100) of this many
    /// steps each, executed one at a time, beside a raw sqlx loop doing the same durable work
    /// per step (renew the lease and insert the step row in one transaction); reports the
    /// per-step time (p50, p99), steps/s, the ratio (median of --rounds) and the statements
    /// per step
    #[arg(long, requires = "runs", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) steps: Option<u16>,
    /// Measure pickup latency: an idle worker, one message at a time, beside the raw driver's
    /// floor, the two sides' samples alternating one by one (ABBA)
    #[arg(long)]
    pub(crate) latency: bool,
    /// Measure the relay: a SQL outbox (--dsn) drained into --to, beside --to's own batched
    /// send and the same relay into memory (the outbox's ceiling), each with the machine's CPU
    /// time per message and cores busy (Linux); medians over --rounds, default 3
    #[arg(long, requires = "to", conflicts_with_all = ["runs", "latency", "raw"])]
    pub(crate) relay: bool,
    /// The relay's destination (with --relay)
    #[arg(long, value_name = "DSN")]
    pub(crate) to: Option<String>,
    /// Latency samples per side (with --latency)
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) samples: u32,
    /// Stamp messages with this many concurrency keys in turn (`ConcurrencyKeyStamp`), to measure
    /// a keyed queue (the DSN sets `concurrency_max=N` or `fair=true`; SQL, Redis) beside the same
    /// DSN without them, in paired rounds (ABBA): the ratio keyed / unkeyed, and each round's
    /// ratio
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000), conflicts_with_all = ["runs", "latency", "relay", "raw"])]
    pub(crate) concurrency_keys: Option<u32>,
    /// Measure Courier on this DSN too, beside --dsn in paired rounds (ABBA), each side on a
    /// queue of its own: the ratios --dsn / --beside and each round's, for example a
    /// `symfony+redis://` queue beside Courier's own format on the same server
    #[arg(long, value_name = "DSN", conflicts_with_all = ["runs", "latency", "relay", "raw", "concurrency_keys"])]
    pub(crate) beside: Option<String>,
}
