//! Redis's own CPU time per consumed message: a keyed queue (100 keys, at most 10 in flight
//! each) beside a plain stream, both consumed by one transport in batches of 64 (`get`, then
//! `ack_batch`). With many workers on one server, this time, not a worker's, bounds the
//! throughput of all of them:
//!
//!     cargo run --release -p courier-redis --example server_cost [redis://127.0.0.1:6379] [messages]
//!
//! The figure is the server's `used_cpu_user + used_cpu_sys` (`INFO cpu`) over the consume, per
//! message: run it on a server nothing else uses. Each queue gets a stream name of its own, and
//! its keys are deleted at the end.

use std::error::Error;

use courier_core::{ConcurrencyKeyStamp, Envelope, Transport};
use courier_redis::{RedisOptions, RedisTransport};
use courier_test::TestMessage;

const BATCH: usize = 64;
const KEYS: u64 = 100;

type Res<T> = Result<T, Box<dyn Error>>;

/// The server's CPU seconds so far (user and system).
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Res<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

/// Sends `n` messages, then consumes them; µs of server CPU per consumed message.
async fn consume_cost(url: &str, keyed: bool, n: u64) -> Res<f64> {
    let stream = format!("courier_server_cost_{:08x}", fastrand::u32(..));
    let mut options = RedisOptions::default().stream(stream.clone());
    if keyed {
        options = options.concurrency_max(10);
    }
    let t = RedisTransport::connect(url, options, courier_test::registry()).await?;
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let measured = async {
        let mut seq = 0;
        while seq < n {
            let batch = (seq..n.min(seq + BATCH as u64))
                .map(|s| {
                    let e = Envelope::new(TestMessage::new(s));
                    if keyed {
                        ConcurrencyKeyStamp::new(format!("key-{}", s % KEYS)).map(|k| e.with(k))
                    } else {
                        Ok(e)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            seq += batch.len() as u64;
            t.send_batch(batch).await?;
        }
        let before = server_cpu(&mut conn).await?;
        let mut got = 0;
        while got < n {
            let batch = t.get(BATCH).await?;
            got += batch.len() as u64;
            t.ack_batch(&batch).await?;
        }
        let after = server_cpu(&mut conn).await?;
        Ok::<_, Box<dyn Error>>((after - before) * 1e6 / n as f64)
    }
    .await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{stream}*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        let () = redis::cmd("DEL").arg(keys).query_async(&mut conn).await?;
    }
    measured
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let n: u64 = std::env::args().nth(2).map_or(Ok(20_000), |a| a.parse())?;
    println!("Redis CPU per consumed message ({n} messages, get + ack in batches of {BATCH}):");
    for round in 1..=3 {
        let plain = consume_cost(&url, false, n).await?;
        let keyed = consume_cost(&url, true, n).await?;
        println!(
            "  round {round}: plain stream {plain:.1} µs, keyed ({KEYS} keys, at most 10 each) {keyed:.1} µs ({:.2}x)",
            keyed / plain
        );
    }
    Ok(())
}
