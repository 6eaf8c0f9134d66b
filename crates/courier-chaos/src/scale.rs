//! Throughput against the number of worker hosts (`scripts/scale`): N messages produced up
//! front, then one `consume` process (default settings) on each of 1, 2 and 4 network-namespace
//! hosts, timed until the queue is drained; per host the messages it handled (its final stats)
//! and the CPU time it used, and the server's CPU time over the same span.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use courier_core::config::Config;
use courier_core::{Envelope, MessageRegistry, Transport, TransportRegistry};
use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio::time::{Instant, sleep, timeout};

use crate::ScaleTick;
use crate::hosts::{Hosts, ServerKind, cpu_of, cpu_of_tree};

/// How often the queue depth is read while the workers drain it.
const POLL: Duration = Duration::from_millis(20);
/// The longest one measurement may take before it is called a failure.
const LIMIT: Duration = Duration::from_secs(180);

/// One measurement: `hosts` workers draining `messages` from `transport`.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The server kind.
    pub transport: ServerKind,
    /// Worker hosts.
    pub hosts: usize,
    /// Messages produced and drained.
    pub messages: u64,
    /// From the first message handled on any host to the last one (the handlers' own clocks).
    pub span: Duration,
    /// When each host handled its first message, after the first host did.
    pub starts: Vec<Duration>,
    /// Each host's share of the messages handled while every host was handling (from the last
    /// host's first message to the first host's last one), 0..1.
    pub shares: Vec<f64>,
    /// From the workers' start to the queue found empty (start-up included).
    pub wall: Duration,
    /// Messages each host handled, from its final stats.
    pub handled: Vec<u64>,
    /// CPU time (user + system) each worker process used.
    pub worker_cpu: Vec<Duration>,
    /// CPU time the server's processes used over `wall`.
    pub server_cpu: Duration,
}

impl Sample {
    /// Messages per second, first to last handling.
    #[must_use]
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.span.as_secs_f64().max(1e-6)
    }
}

fn factories() -> TransportRegistry {
    let mut f = TransportRegistry::new();
    f.register(Arc::new(courier_sql::SqlTransportFactory));
    f.register(Arc::new(courier_redis::RedisTransportFactory));
    f.register(Arc::new(courier_amqp::AmqpTransportFactory));
    f.register(Arc::new(courier_nats::NatsTransportFactory));
    f
}

/// The transport DSN with a queue of its own for one measurement.
fn dsn(kind: ServerKind, base: &str, queue: &str) -> String {
    match kind {
        ServerKind::Postgres => format!("{base}?queue_name={queue}"),
        ServerKind::Redis => format!("{base}?stream={queue}"),
        ServerKind::Rabbitmq => format!("{base}?exchange={queue}&queues={queue}"),
    }
}

async fn produce(transport: &Arc<dyn Transport>, messages: u64) -> anyhow::Result<()> {
    let mut next = 0;
    while next < messages {
        let end = (next + 500).min(messages);
        let batch: Vec<Envelope> = (next..end)
            .map(|seq| Envelope::new(ScaleTick { seq }))
            .collect();
        timeout(Duration::from_secs(30), transport.send_batch(batch))
            .await
            .context("producing: send_batch timed out")??;
        next = end;
    }
    Ok(())
}

async fn count(transport: &Arc<dyn Transport>) -> anyhow::Result<u64> {
    let counter = transport
        .as_message_count()
        .context("the transport cannot count")?;
    Ok(timeout(Duration::from_secs(10), counter.message_count())
        .await
        .context("message_count timed out")??)
}

/// Stops a worker with SIGTERM and reads its final stats (`--format json`): messages handled,
/// and when it handled each (the file it wrote at exit).
async fn stop(mut child: Child, log: &Path, ticks: &Path) -> anyhow::Result<(u64, Vec<i64>)> {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    let status = timeout(Duration::from_secs(40), child.wait())
        .await
        .context("a worker did not stop within 40 s of SIGTERM")??;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).await?;
    }
    let stats: serde_json::Value = serde_json::from_str(&out).with_context(|| {
        format!(
            "a worker ({status}) printed no final stats; see {}",
            log.display()
        )
    })?;
    let handled = stats["handled"]
        .as_u64()
        .context("final stats without `handled`")?;
    let times = std::fs::read_to_string(ticks)
        .with_context(|| format!("the worker wrote no {}", ticks.display()))?
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    Ok((handled, times))
}

/// Runs one measurement on the first `n` of `hosts`.
///
/// # Errors
/// A server or worker that failed, or a queue not drained within three minutes.
pub async fn measure(
    hosts: &Hosts,
    kind: ServerKind,
    n: usize,
    messages: u64,
    worker: &Path,
    dir: &Path,
) -> anyhow::Result<Sample> {
    let base = hosts
        .url(kind)
        .with_context(|| format!("no {} server is up", kind.name()))?;
    let queue = format!("scale_{}_{n}_{:08x}", kind.name(), fastrand::u32(..));
    let config_path = dir.join(format!("{queue}.toml"));
    std::fs::write(
        &config_path,
        format!(
            "[transports.scale]\ndsn = \"{}\"\n\n[routing]\n\"scale.tick\" = \"scale\"\n",
            dsn(kind, base, &queue)
        ),
    )?;
    let config = Config::load(&config_path)?;
    let mut registry = MessageRegistry::new();
    registry.register::<ScaleTick>();
    let transports = config.connect(&factories(), Arc::new(registry)).await?;
    let transport = transports
        .get("scale")
        .cloned()
        .context("no transport `scale`")?;
    if let Some(setup) = transport.as_setup() {
        setup.setup().await?;
    }
    produce(&transport, messages).await?;
    let queued = count(&transport).await?;
    if queued != messages {
        bail!("{queued} messages queued after producing {messages}");
    }

    let server_pid = hosts.server_pid(kind);
    let server_before = server_pid.map(cpu_of_tree).unwrap_or_default();
    let spawned = Instant::now();
    let mut workers: Vec<(Child, PathBuf, PathBuf)> = Vec::new();
    for i in 0..n {
        let log = dir.join(format!("{queue}-host{}.log", i + 1));
        let ticks = log.with_extension("ticks");
        let child = hosts
            .command(i, worker)
            .args(["consume", "scale", "--format", "json", "--config"])
            .arg(&config_path)
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .env(crate::agent::TICKS_ENV, &ticks)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker with ip netns exec")?;
        workers.push((child, log, ticks));
    }
    let drained_at = loop {
        let left = count(&transport).await?;
        let now = Instant::now();
        if left == 0 {
            break now;
        }
        if now - spawned > LIMIT {
            bail!("{left} of {messages} messages still queued after {LIMIT:?}");
        }
        for (child, log, _) in &mut workers {
            if let Ok(Some(status)) = child.try_wait() {
                bail!("a worker exited early ({status}); see {}", log.display());
            }
        }
        sleep(POLL).await;
    };
    let worker_cpu: Vec<Duration> = workers
        .iter()
        .map(|(c, ..)| c.id().map(cpu_of).unwrap_or_default())
        .collect();
    let server_cpu = server_pid
        .map(cpu_of_tree)
        .unwrap_or_default()
        .saturating_sub(server_before);
    let mut handled = Vec::new();
    let mut times: Vec<Vec<i64>> = Vec::new();
    for (child, log, ticks) in workers {
        let (h, t) = stop(child, &log, &ticks).await?;
        handled.push(h);
        times.push(t);
    }
    let total: u64 = handled.iter().sum();
    if total != messages {
        bail!("the hosts handled {total} messages of {messages}: {handled:?}");
    }
    let firsts: Vec<i64> = times
        .iter()
        .map(|t| t.first().copied().unwrap_or(0))
        .collect();
    let lasts: Vec<i64> = times
        .iter()
        .map(|t| t.last().copied().unwrap_or(0))
        .collect();
    let first = firsts.iter().copied().min().unwrap_or(0);
    let last = lasts.iter().copied().max().unwrap_or(0);
    let (from, to) = (
        firsts.iter().copied().max().unwrap_or(0),
        lasts.iter().copied().min().unwrap_or(0),
    );
    let within: Vec<usize> = times
        .iter()
        .map(|t| t.iter().filter(|x| (from..=to).contains(*x)).count())
        .collect();
    let all: usize = within.iter().sum();
    let shares = within
        .iter()
        .map(|w| *w as f64 / all.max(1) as f64)
        .collect();
    let us = |d: i64| Duration::from_micros(u64::try_from(d).unwrap_or(0));
    Ok(Sample {
        transport: kind,
        hosts: n,
        messages,
        span: us(last - first),
        starts: firsts.iter().map(|f| us(f - first)).collect(),
        shares,
        wall: drained_at - spawned,
        handled,
        worker_cpu,
        server_cpu,
    })
}

fn secs(d: &[Duration]) -> String {
    d.iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The table (Markdown): one row per sample, the scaling efficiency against the same
/// transport's 1-host rate.
#[must_use]
pub fn table(samples: &[Sample], cores: usize) -> String {
    let mut out = String::from(
        "| transport | hosts | messages/s | efficiency | handled per host | share while all ran, % | worker CPU s (each) | server CPU s | CPU busy |\n\
         |---|---:|---:|---:|---|---|---|---:|---:|\n",
    );
    for s in samples {
        let one = samples
            .iter()
            .find(|o| o.transport == s.transport && o.hosts == 1)
            .map(Sample::rate);
        let efficiency = one.map_or_else(
            || "-".to_owned(),
            |r| format!("{:.2}", s.rate() / (s.hosts as f64 * r)),
        );
        let busy = (s.worker_cpu.iter().sum::<Duration>() + s.server_cpu).as_secs_f64()
            / (s.wall.as_secs_f64() * cores as f64).max(1e-3);
        let handled = s
            .handled
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / ");
        let starts = s
            .shares
            .iter()
            .map(|f| format!("{:.0}", f * 100.0))
            .collect::<Vec<_>>()
            .join(" / ");
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {efficiency} | {handled} | {starts} | {} | {:.2} | {:.0}% |",
            s.transport.name(),
            s.hosts,
            s.rate(),
            secs(&s.worker_cpu),
            s.server_cpu.as_secs_f64(),
            busy * 100.0
        );
    }
    out
}
