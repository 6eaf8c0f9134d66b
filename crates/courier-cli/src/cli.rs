//! The command line, declared with clap's derive API.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod bench;
pub(crate) use bench::BenchArgs;

/// Pluggable message transports with durable runs.
#[derive(Debug, Parser)]
#[command(name = "courier", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// Configuration file (else $COURIER_CONFIG, else ./courier.toml, else the embedded default:
    /// SQLite `courier.db` in the working directory)
    #[arg(long, global = true, value_name = "FILE", env = "COURIER_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// More output (-v: per-message logs, -vv: debug)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Errors only
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Output format for commands that print data
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub(crate) format: Format,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Human tables and sentences
    Text,
    /// JSON, the scripting interface
    Json,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per process; `consume` has many flags"
)]
pub(crate) enum Command {
    /// Create tables / queues / streams for every transport and the run store, or for the named
    /// transports only (idempotent)
    ///
    /// With --print-sql nothing connects: the complete DDL of every table the configuration
    /// needs (each SQL transport's messages, workers, schedules, paused, limits and dedup
    /// tables, the run store's runs, events and steps) is printed in order, with the rows each
    /// `<table>_migrations` table records, for the application's own migration tool. Transports
    /// then run with `auto_setup=false` and check that every migration is recorded.
    Setup {
        /// Transports to set up (default: every transport, and the run store)
        transports: Vec<String>,
        /// Print the SQL instead of running it
        #[arg(long)]
        print_sql: bool,
        /// With --print-sql: the database (default: each transport's and the run store's own)
        #[arg(long, value_name = "postgres|mysql|sqlite", requires = "print_sql")]
        dialect: Option<String>,
        /// With --print-sql: the messages table (default: each SQL transport's `table_name`)
        #[arg(long = "table", value_name = "NAME", requires = "print_sql")]
        table: Option<String>,
    },
    /// Consume messages from transports (all non-failure transports when none is named)
    ///
    /// A broker or database that is down at start is retried with capped exponential backoff
    /// (0.5 s doubling up to 30 s), each attempt logged with the transport (or run store), its
    /// redacted DSN and the error, until it comes up or the worker is stopped (exit 0). A DSN or
    /// option that is wrong exits 2 at once.
    ///
    /// SIGINT/SIGTERM stops fetching and lets in-flight messages finish within --grace (exit 0);
    /// a second signal exits at once with code 130, after logging how many in-flight messages it
    /// leaves for redelivery.
    Consume(ConsumeArgs),
    /// Forward an outbox queue to another transport, in batches, unchanged (same message id,
    /// same stamps); the outbox rows are deleted only after the destination confirmed them
    ///
    /// At least once across crashes (a batch confirmed but not yet deleted is sent again after
    /// the outbox's redelivery window; from PostgreSQL, whose batches are deleted in a
    /// transaction held until the destination confirmed, at once); one batch sent at a time, so
    /// the outbox's order is kept.
    /// SIGINT/SIGTERM finishes the batch in flight and exits 0.
    ///
    /// JSON (on exit): {"from", "to", "relayed", "batches"}.
    #[command(verbatim_doc_comment)]
    Relay(RelayArgs),
    /// Message counts per transport, and how long each queue's oldest message has waited
    ///
    /// JSON: {transport: count | null}; with --oldest, {transport: {"messages": count | null,
    /// "oldest_s": seconds | null}} (null: empty, or the transport cannot tell; SQL can). For
    /// an outbox queue, the count is its backlog and the oldest age the relay's lag.
    /// When an `[agents.NAME]` table has a `breaker`, the text output adds each provider's
    /// circuit breaker (state, failures in its window, when it last opened); --breakers shows
    /// only them, in JSON [{"provider", "state": "closed" | "open" | "half_open", "failures",
    /// "opened_at": RFC 3339 | null}].
    #[command(verbatim_doc_comment)]
    Stats {
        /// Transports to count (default: all)
        transports: Vec<String>,
        /// Also give each queue's oldest-message age in the JSON output (the text table
        /// always shows it)
        #[arg(long)]
        oldest: bool,
        /// Only the agents' circuit breakers (feature `agent`)
        #[arg(long, conflicts_with_all = ["transports", "oldest"])]
        breakers: bool,
        /// Per concurrency key of each keyed queue (Redis `concurrency_max` / `fair`): in
        /// flight / max and queued, the 10 busiest keys and the rest as `other`; in JSON
        /// {transport: {"max", "keys": [{"key", "in_flight", "queued"}], "other", "other_keys"}}
        #[arg(long, conflicts_with_all = ["oldest", "breakers"])]
        keys: bool,
    },
    /// Inspect, retry or remove messages in failure transports
    #[command(subcommand)]
    Failed(FailedCommand),
    /// Ask every worker of this configuration to stop after its in-flight messages, on every
    /// host, through the worker registry (the stop file next to the configuration only when no
    /// transport or run store keeps a registry)
    ///
    /// JSON: {"requested": N} (workers asked), or {"stop_file", "requested_at_ms"} without a
    /// registry.
    #[command(verbatim_doc_comment)]
    StopWorkers,
    /// The running workers of this configuration (id, host, pid, version, transports, start,
    /// last heartbeat, handled, failed), from the worker registry
    ///
    /// JSON: an array of {"id", "host", "pid", "version", "transports", "started_at",
    /// "started_at_ms", "last_heartbeat", "last_heartbeat_ms", "handled", "failed",
    /// "stop_requested"}, oldest first (times RFC 3339, plus the raw epoch ms).
    #[command(verbatim_doc_comment)]
    Workers,
    /// The configured schedules with their next fire time, last fired tick and lease holder
    ///
    /// JSON: an array of {"name", "message", "agent", "trigger", "missed", "next_fire",
    /// "next_fire_ms", "last_fired", "last_fired_ms", "owner", "store"}, by name (times RFC
    /// 3339, plus the raw epoch ms; null when unknown).
    #[command(verbatim_doc_comment)]
    Schedules,
    /// Pause a transport's queue: its workers on every host stop fetching from it within a
    /// second (in-flight messages finish); the flag lives in the transport's server
    ///
    /// JSON: {"transport", "paused": true, "changed"} (changed: it was not paused before).
    #[command(verbatim_doc_comment)]
    Pause {
        /// The transport (SQL: its queue_name; Redis: its stream)
        transport: String,
    },
    /// Resume a paused transport's queue
    ///
    /// JSON: {"transport", "paused": false, "changed"}.
    #[command(verbatim_doc_comment)]
    Resume {
        /// The transport
        transport: String,
    },
    /// Durable agent runs
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Requeue or dead-letter runs whose lease expired; re-dispatch queued runs overdue by more
    /// than `[runs] redispatch_after` (default: the lease), their message presumably lost
    Reap(ReapArgs),
    /// The main job on the embedded default: scripted runs, workers, a crash, the reaper
    Demo(DemoArgs),
    /// Serve the web dashboard: transports, runs, failed messages, workers, and a JSON API
    ///
    /// Loopback by default (and then only requests for a loopback host name are served). A
    /// non-loopback --listen needs --token (or COURIER_DASHBOARD_TOKEN): every request must
    /// carry it, as `Authorization: Bearer TOKEN` or the cookie set by opening a page once with
    /// `?token=TOKEN`. Forms post with a per-process CSRF token; GET never changes state.
    Dashboard(DashboardArgs),
    /// Send/consume benchmark through the real worker path
    ///
    /// Modes: the default measures produce and consume throughput (and a short latency sample);
    /// --raw adds the raw driver doing the same protocol work (sqlx on SQLite and PostgreSQL,
    /// redis-rs on Redis Streams, lapin on RabbitMQ: publish a batch then await its confirms,
    /// basic.qos = fetch size, basic.ack multiple; each side on a version 2 classic queue of its
    /// own) in paired rounds, medians reported. --runs executes scripted 3-step no-op runs with
    /// --workers workers and counts the statements each run costs. --latency times send ->
    /// handler with an idle worker, beside the raw floor, sample by sample in ABBA order (Redis
    /// XREADGROUP BLOCK, PostgreSQL LISTEN/NOTIFY + claim, RabbitMQ push consumer, SQLite polling
    /// on the transport's schedule). Each round runs on a queue of its own (a SQL `queue_name`,
    /// a Redis stream, an AMQP exchange and queue; Symfony's layouts alike), never the app's.
    ///
    /// JSON (--format json), one object:
    ///   default: {"mode": "throughput", "dsn", "messages", "size", "fetch_size", "concurrency",
    ///     "rounds", "produce_per_s", "consume_per_s", "p50_ms", "p99_ms", "raw": {produce_per_s,
    ///     consume_per_s, p50_ms, p99_ms} | null, "ratio": courier / raw consume | null,
    ///     "produce_ratio": courier / raw produce | null, "round_ratios", "produce_round_ratios";
    ///     --concurrency-keys: "unkeyed" (the queue without keys) in place of "raw", the ratios
    ///     keyed / unkeyed; --beside: "beside" likewise; with either, "cpu": {"produce_us",
    ///     "consume_us": [this side, the other] machine-wide CPU microseconds per message
    ///     (medians; client and servers, Linux), "produce_round_ratios", "round_ratios": each
    ///     round's other side's CPU / this side's} | null}
    ///   --runs: {"mode": "runs", "dsn", "runs", "workers", "steps_per_run", "fetch_size",
    ///     "concurrency", "submit_per_s", "runs_per_s", "store_statements_per_run",
    ///     "store_statements": {"submit", "execute"} (per run), "store_calls_per_run": {method:
    ///     calls}, "transport_statements_per_run", "transport_calls_per_run": {method: calls},
    ///     "empty_gets_per_run"}
    ///   --runs --steps N: {"mode": "steps", "dsn", "runs", "steps_per_run", "courier": {"p50_us",
    ///     "p99_us", "steps_per_s"}, "raw": {"p50_us", "p99_us", "steps_per_s"}, "ratio": courier /
    ///     raw steps/s, median of --rounds (default 5) rounds, "overall_ratio", "round_ratios",
    ///     "statements_per_step": {"courier", "raw"}}
    ///   --relay: {"mode": "relay", "from", "to", "messages", "size", "batch_size", "rounds",
    ///     "direct_send_per_s", "relay_per_s", "ratio": relay / direct, "outbox_alone_per_s": the
    ///     same relay into memory, "drain_execution_per_s": the server's execution time of the
    ///     drain statements over the same rows, no relay (PostgreSQL outbox) | null,
    ///     "cpu": {"direct_send", "relay", "outbox_alone"}: {"us_per_msg", "cores_busy"}
    ///     machine-wide, from /proc/stat (Linux) | null}
    ///   --latency: {"mode": "latency", "dsn", "samples", "size", "fetch_size",
    ///     "courier": {"p50_ms", "p99_ms"}, "raw": {"p50_ms", "p99_ms", "floor"} | null,
    ///     "ratio": courier p50 / raw p50 | null}
    #[command(verbatim_doc_comment)]
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// Transports to consume, highest priority first (default: every transport that is no
    /// failure transport)
    pub(crate) transports: Vec<String>,
    /// With no transport named: consume all but these (comma-separated)
    #[arg(long, value_delimiter = ',', value_name = "TRANSPORT")]
    pub(crate) exclude_receivers: Vec<String>,
    /// Consume only these queues of the transports (comma-separated, highest priority first;
    /// SQL `queue_name`s, AMQP queues)
    #[arg(long, value_delimiter = ',', value_name = "QUEUE")]
    pub(crate) queues: Vec<String>,
    /// Dispatch every received message to this bus, whatever bus it names
    #[arg(long, value_name = "NAME")]
    pub(crate) bus: Option<String>,
    /// Stop after this many messages
    #[arg(long)]
    pub(crate) limit: Option<u64>,
    /// Stop after this many failed messages
    #[arg(long)]
    pub(crate) failure_limit: Option<u64>,
    /// Stop after this long (e.g. 1h)
    #[arg(long, value_parser = parse_duration)]
    pub(crate) time_limit: Option<Duration>,
    /// Stop when resident memory exceeds this (e.g. 256M)
    #[arg(long, value_parser = parse_bytes)]
    pub(crate) memory_limit: Option<u64>,
    /// Handlers running at once
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) concurrency: u16,
    /// Messages fetched per round trip
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) fetch_size: u16,
    /// Idle wait where the transport cannot block
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) sleep: Duration,
    /// Heartbeat interval for in-flight messages
    #[arg(long, value_parser = parse_duration)]
    pub(crate) keepalive: Option<Duration>,
    /// How long in-flight messages may finish after SIGINT/SIGTERM
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) grace: Duration,
    /// Run the stale-run reaper at this interval inside the worker (at most `[runs] lease`)
    #[arg(long, value_parser = parse_duration)]
    pub(crate) reap_every: Option<Duration>,
    /// This worker's id in the worker registry (`courier workers`); default `host:pid:random`
    /// (host and pid alone are not unique: containers often all run pid 1)
    #[arg(long, value_name = "ID")]
    pub(crate) worker_id: Option<String>,
    /// How often the worker heartbeats in the worker registry (at most a third of the
    /// registry's `worker_stale_after`)
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub(crate) registry_heartbeat: Duration,
    /// Serve Prometheus metrics at `GET /metrics` on this address (e.g. 127.0.0.1:9464), and
    /// sample every transport's queue depth every 5 s
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The outbox: a SQL transport of the configuration
    #[arg(long, value_name = "TRANSPORT")]
    pub(crate) from: String,
    /// Where its messages go (any transport)
    #[arg(long, value_name = "TRANSPORT")]
    pub(crate) to: String,
    /// Messages fetched, sent and deleted per batch
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) batch_size: u16,
    /// Stop after forwarding this many messages
    #[arg(long)]
    pub(crate) limit: Option<u64>,
    /// From a PostgreSQL outbox: the longest a batch's transaction stays open while the
    /// destination refuses it; then the batch goes back to the outbox, unlocked, and is resent
    /// from memory until the destination is back. After four times this (a minute at least),
    /// the server ends a drain's transaction left idle (a relay cut off from it), and the relay
    /// gives up on a call to the outbox that got no answer (and tries again)
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) hold_limit: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum FailedCommand {
    /// List failed messages, or show one
    Show {
        /// A message id
        id: Option<String>,
        /// The failure transport (default: every one configured)
        #[arg(long)]
        transport: Option<String>,
        /// At most this many messages
        #[arg(long, default_value_t = 50)]
        max: usize,
        /// Only messages of this type (wire name, e.g. `app.order_placed`)
        #[arg(long, value_name = "TYPE")]
        class_filter: Option<String>,
        /// Counts by message type and by error class instead of the list
        #[arg(long, conflicts_with = "id")]
        stats: bool,
    },
    /// Send failed messages back to their original transport (or --to), then remove them; on a
    /// terminal, without --force, shows each one and asks: retry, delete, skip or quit
    Retry(FailedRetry),
    /// Remove failed messages for good; on a terminal, without --force, asks for each one
    Remove(FailedIds),
}

#[derive(Debug, Args)]
pub(crate) struct FailedIds {
    /// Message ids
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) ids: Vec<String>,
    /// Every failed message
    #[arg(long)]
    pub(crate) all: bool,
    /// The failure transport (default: every one configured)
    #[arg(long)]
    pub(crate) transport: Option<String>,
    /// Only messages of this type (wire name)
    #[arg(long, value_name = "TYPE")]
    pub(crate) class_filter: Option<String>,
    /// Do not ask: on a terminal each message is shown and confirmed unless --force
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct FailedRetry {
    #[command(flatten)]
    pub(crate) ids: FailedIds,
    /// Send them to this transport instead of the one each failed on
    #[arg(long, value_name = "TRANSPORT")]
    pub(crate) to: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// Create a run and queue it (prints its id)
    Submit {
        /// The agent's name
        agent: String,
        /// Input JSON, or @FILE
        #[arg(long, default_value = "{}")]
        input: String,
        /// Run it here and now, in this process, instead of queueing it
        #[arg(long, conflicts_with = "unique")]
        interactive: bool,
        /// A uniqueness key: while a run queued with this key holds it (for --unique-for), no
        /// second one is queued; the holder's id is printed instead (JSON: "duplicate": true)
        #[arg(long, requires = "unique_for")]
        unique: Option<String>,
        /// How long the run holds its --unique key, from now (e.g. 10min, 1h)
        #[arg(long, value_parser = parse_duration, requires = "unique")]
        unique_for: Option<Duration>,
        /// A concurrency key (1 to 200 bytes): at most `concurrency_max` runs of one key run at
        /// once, on a runs transport given `concurrency_max`
        #[arg(long, value_name = "KEY", conflicts_with_all = ["unique", "interactive"])]
        concurrency_key: Option<String>,
    },
    /// One run with its events, its steps (journal), budget and pending wait
    Show {
        /// The run id
        id: String,
    },
    /// Runs, newest first
    List {
        /// Only runs with this status
        #[arg(long)]
        status: Option<String>,
        /// At most this many runs
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// The persisted steps of a run
    Events {
        /// The run id
        id: String,
    },
    /// Cancel a run that has not finished
    Cancel {
        /// The run id
        id: String,
    },
    /// Dispatch a run again: a queued run whose message was lost is re-dispatched; a running run
    /// whose lease expired is requeued. Anything else is refused (exit 1, saying why)
    Requeue {
        /// The run id
        id: String,
    },
    /// Send a signal to a run: a run waiting for it is woken (queued and dispatched); a run not
    /// waiting yet finds it at its wait. A run waiting for another signal refuses it (exit 1)
    Signal {
        /// The run id
        id: String,
        /// The signal's name
        name: String,
        /// The signal's data (JSON)
        #[arg(long, default_value = "null")]
        data: String,
        /// Who sends it (recorded with the signal)
        #[arg(long)]
        by: Option<String>,
    },
    /// Resolve the guarded step a run parked on (waiting_for_approval): run it again with the
    /// same key, skip it with --result as its result, or fail the run
    Resolve {
        /// The run id
        id: String,
        /// retry, skip or fail
        #[arg(value_enum)]
        action: ResolveAction,
        /// With skip: the step's result (JSON; default null)
        #[arg(long)]
        result: Option<String>,
    },
    /// A new run of the same agent, input and budget whose steps before --from-step replay this
    /// run's journal, so it runs again from that step (prints the new id)
    Fork {
        /// The run id
        id: String,
        /// The first step that runs again (from 1)
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        from_step: i64,
    },
    /// Approve a run waiting for approval and resume it here, in this process
    Approve {
        /// The run id
        id: String,
    },
    /// Give a run waiting for input its input and resume it here, in this process
    Input {
        /// The run id
        id: String,
        /// The input (JSON, or @FILE)
        #[arg(long)]
        data: String,
    },
    /// Delete finished runs older than --older-than (by when they finished), with their events
    /// and steps, in batches; prints how many
    Prune {
        /// Age of the runs to delete (e.g. 30d, 12h)
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Only runs with these statuses (comma-separated; terminal ones: completed, failed,
        /// cancelled; default all three)
        #[arg(long, value_delimiter = ',', value_name = "STATUS")]
        status: Vec<String>,
        /// Runs deleted per batch (one transaction each)
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=500))]
        batch: u64,
    },
}

/// How `courier runs resolve` resolves a parked step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ResolveAction {
    /// Run the step again, with the same idempotency key
    Retry,
    /// Do not run it: journal --result as its result
    Skip,
    /// Fail the run (class ambiguous_effect)
    Fail,
}

#[derive(Debug, Args)]
pub(crate) struct ReapArgs {
    /// At most this many stale runs (default: the configured reap_limit)
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Only list what would be reaped
    #[arg(long)]
    pub(crate) dry_run: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Runs to submit (default 200; 12 with --agent llm)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) runs: Option<u32>,
    /// Worker processes to start (`courier consume`); one is killed, another finishes its run
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub(crate) workers: u16,
    /// Database file (default: courier.db in the working directory)
    #[arg(long, value_name = "FILE")]
    pub(crate) db: Option<PathBuf>,
    /// `llm`: LLM agent runs against an OpenAI-compatible test server started in-process on
    /// 127.0.0.1 (tool calls, a 429, a 503 then a fallback, a slow answer), the server's call
    /// counter showing that the killed worker's run did not call the model again for the steps it
    /// had finished (feature `agent`)
    #[arg(long, value_name = "AGENT", value_parser = ["llm"])]
    pub(crate) agent: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DashboardArgs {
    /// Address to serve on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Require this token on every request (needed for a non-loopback --listen)
    #[arg(long, env = "COURIER_DASHBOARD_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
}

/// `250ms`, `30s`, `10min`, `1h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration `{s}` ({e}); write e.g. 250ms, 30s, 10min, 1h"))
}

/// `256M`, `1G`, `512K`, `1048576` (bytes; K/M/G are powers of 1024, `MB`/`MiB` accepted).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let err = || format!("invalid size `{s}`; write e.g. 512K, 256M, 1G or a number of bytes");
    let n: u64 = digits.parse().map_err(|_| err())?;
    let factor: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(err()),
    };
    n.checked_mul(factor).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("256M"), Ok(256 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
