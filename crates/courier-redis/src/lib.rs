//! Redis Streams transport for [Courier](https://docs.rs/courier) (`redis://`, `rediss://`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Envelope, Message, MessageRegistry, Transport};
//! use courier_redis::{RedisOptions, RedisTransport};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping;
//! impl Message for Ping { const NAME: &'static str = "app.ping"; }
//!
//! # async fn run() -> Result<(), courier_core::TransportError> {
//! let registry = Arc::new(MessageRegistry::new().with::<Ping>());
//! let options = RedisOptions::default().stream("pings");
//! let transport = RedisTransport::connect("redis://127.0.0.1:6379", options, registry).await?;
//! transport.send(Envelope::new(Ping)).await?;
//! for envelope in transport.get(64).await? {
//!     transport.ack(&envelope).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! One stream per queue (`stream`, default `messages`) read through one consumer group
//! (`group`, default `courier`). Each entry has two fields, `body` (the message JSON) and
//! `headers` (one JSON object of string -> string), so a producer in any language can `XADD`
//! a message. The transport message id is the stream entry id. Delayed messages wait in the
//! sorted set `<stream>:delayed` (scored by due time in ms on the **server clock**, member an
//! id `d-<hex>`) with their payload in the hash `<stream>:delayed:data`; a Lua script moves every
//! due entry to the stream atomically (`ZRANGEBYSCORE` + `XADD` + `ZREM`). Keys use no hash
//! tags: Redis Cluster is not supported.
//!
//! The worker registry ([`WorkerRegistry`](courier_core::WorkerRegistry), `courier workers`,
//! `courier stop-workers`) is the hash `<group>:workers` (field = worker id, value = its record as
//! JSON, times from the server's `TIME`) and the set `<group>:workers:stop` of the ids asked to
//! stop; each operation is one Lua script, `list` deletes the records older than
//! `worker_stale_after` (default 30 s) on the way.
//!
//! # Delivery
//!
//! - `get(max)` sends the promotion script and `XREADGROUP ... COUNT max BLOCK <poll window>` in
//!   **one pipeline** on a connection of its own (blocking reads never stall sends and acks on
//!   the shared connection), so promoting delayed entries costs no extra round trip. It
//!   promotes when a known delayed entry is due, and otherwise at most every 100 ms, so a
//!   delayed message is delivered at most one poll window after it is due. A consumer that
//!   knows of a delayed entry blocks only until it is due.
//! - Every `claim_interval`, `get` claims up to `max` deliveries idle longer than
//!   `redeliver_timeout` (`XAUTOCLAIM` with a cursor, not one at a time) and removes consumers
//!   with nothing pending that have been idle for 10 minutes (or `redeliver_timeout`, if longer).
//! - On its first read, after every reconnect, and after a `get` that was dropped before its
//!   reply came back, `get` takes back this consumer's own pending entries that are not in flight
//!   in this process (a restart with a fixed `consumer`, a reply lost with a broken connection,
//!   or a stopped worker's blocking read that stayed on the server and was handed the next
//!   entries), so nothing waits for `redeliver_timeout` needlessly.
//! - Each envelope carries `TransportMessageIdStamp(entry id)` and `DeliveryTagStamp(delivery
//!   count)`. `ack`, `reject`, `keepalive` and `retry` act only on a delivery this consumer
//!   still owns **with this delivery count**, so the late ack of a superseded delivery (one that
//!   `XAUTOCLAIM` gave to another consumer, or back to this one with a higher count) is a no-op
//!   and never acks or deletes the new delivery; acking an already-acked entry is a success.
//!   Ownership is proven one of two ways, both in the same single round trip:
//!   - *by time* (the fast path, plain `XACK` + `XDEL` like a hand-written consumer): the
//!     envelope is this process's live delivery (same count) and was delivered or kept alive
//!     less than `redeliver_timeout / 2` ago, timed from before the request that delivered it.
//!     `XAUTOCLAIM` needs the full `redeliver_timeout` of server-side idle time, which starts
//!     after that moment, so nobody can have claimed it yet. (Rewriting idle times by hand with
//!     `XCLAIM ... IDLE` from outside breaks this premise.)
//!   - *by the server* otherwise: a Lua script reads the entry's owner and delivery count with
//!     `XPENDING` and acks only a match.
//! - `ack` / `reject` are `XACK` + `XDEL` (with `delete_after_ack`, the default) in one round
//!   trip (plain commands on the fast path, the ownership script otherwise); `ack_batch` is one
//!   `XACK` and one `XDEL` with all ids. `send_batch`
//!   pipelines its `XADD`s. `keepalive` is `XCLAIM ... JUSTID` (resets the idle time without
//!   counting a delivery). `retry` adds the new entry (stream or delayed set) and acks the old
//!   one in one script: never lost, never duplicated by a crash in between.
//! - A missing group (`NOGROUP`: stream evicted or deleted) is recreated from id `0` and the
//!   operation continues; entries still in the stream are delivered again (at least once).
//! - A broken connection is reopened with capped backoff (50 ms doubling to 2 s); operations on
//!   the shared connection are retried a few times, `get` keeps retrying within its poll window
//!   and then returns a transient error.
//!
//! # Counting and listing
//!
//! `message_count` is exact when idle: with `delete_after_ack` it is `XLEN` (undelivered and
//! pending entries) plus the delayed set; without, the group's undelivered (`lag`) plus pending
//! entries plus the delayed set. `list` / `find` / `remove` cover the stream (`XRANGE`, `XDEL`)
//! and the delayed set, so a stream can serve as a failure transport.
//!
//! # Flow control per key: a keyed queue
//!
//! With `concurrency_max=N` or `fair=true`, the queue is *keyed*: a message's concurrency key
//! is its [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp), else the string field of
//! its JSON body that `concurrency_key=$.path` names (a missing field, a non-string one or a key
//! over 200 bytes is refused at send, naming the path), else none (an unlimited lane of its
//! own). Messages then wait in a list per key under `<stream>:keyed:` instead of the stream,
//! and every operation is one Lua script:
//!
//! - `get` moves due delayed messages to their key, delivers again every message whose lease
//!   ended (it keeps its slot: a killed worker's message comes back first, delivery count + 1),
//!   then takes ready messages key after key in turn (a rotating list of the keys with messages
//!   waiting), passing over a key with `concurrency_max` deliveries unsettled; with `fair=true`
//!   one message per key per turn. Each delivery is a lease of `redeliver_timeout` on the
//!   server clock (a sorted set), renewed by `keepalive`.
//! - `ack`, `reject` and `retry` free the slot in the same script that settles the delivery,
//!   only while that delivery's lease is held: the lease names the message, its delivery count
//!   and its key, so a superseded delivery's ack is a no-op. So a slot is held exactly as long
//!   as its lease: it cannot leak.
//! - A consumer that finds nothing to take blocks (`XREAD BLOCK`) on the stream
//!   `<stream>:keyed:signal`, to which a send, or an ack freeing a slot of a key with messages
//!   waiting, appends: it wakes at once, not after polling, and no later than when a delayed
//!   message or a lease is due.
//!
//! Cost: a keyed `get` visits keys one by one (one `LMOVE` per key visited, every waiting key
//! when all are full), and each message costs a hash entry and a lease more than a stream entry
//! (about 1.5-1.9x a stream's server CPU per message).
//! Strict FIFO across keys is not kept (FIFO holds inside a key); a plain queue keeps it. A
//! keyed queue cannot list, find or remove messages, nor share its messages with other groups
//! (`delete_after_ack=false` is refused).
//!
//! # Options (DSN query)
//!
//! `stream`, `group`, `consumer` (default `host:pid:random`, unique per transport),
//! `delete_after_ack` (default true), `stream_max_entries` (`MAXLEN ~`), `redeliver_timeout`
//! (default 30s), `claim_interval`, `db`, `poll_window` (default 1s), `concurrency_max`,
//! `concurrency_key` and `fair` (a keyed queue, above), see [`RedisOptions`].
//! `rediss://` needs the `tls` feature.

mod admin;
mod dedup;
mod factory;
mod get;
mod in_flight;
mod keyed;
mod keyed_ops;
mod limits;
mod link;
mod options;
mod reader;
mod reply;
mod schedules;
mod scripts;
mod transport;
mod workers;

pub use factory::RedisTransportFactory;
pub use options::RedisOptions;
pub use transport::RedisTransport;
