//! `scale`: throughput against worker hosts (`scripts/scale`). Brings up network-namespace hosts
//! and private servers with `scripts/hosts`, measures 1, 2 and 4 hosts per transport, prints a
//! Markdown table, and takes the hosts down again. Needs root.
//!
//! ```text
//! scale [--messages N] [--rounds R] [--hosts 1,2,4] [postgres|redis|rabbitmq ...]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use courier_chaos::hosts::{Hosts, ServerKind};
use courier_chaos::scale::{Sample, measure, table};

const USAGE: &str =
    "usage: scale [--messages N] [--rounds R] [--hosts 1,2,4] [postgres|redis|rabbitmq ...]";

struct Args {
    messages: u64,
    rounds: usize,
    hosts: Vec<usize>,
    kinds: Vec<ServerKind>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        messages: 20_000,
        rounds: 3,
        hosts: vec![1, 2, 4],
        kinds: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--messages" => {
                args.messages = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=1_000_000).contains(n))
                    .ok_or("--messages needs a number from 1 to 1,000,000")?;
            }
            "--rounds" => {
                args.rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=9).contains(n))
                    .ok_or("--rounds needs a number from 1 to 9")?;
            }
            "--hosts" => {
                args.hosts = it
                    .next()
                    .map(|v| {
                        v.split(',')
                            .map(str::parse)
                            .collect::<Result<Vec<usize>, _>>()
                    })
                    .and_then(Result::ok)
                    .filter(|h| !h.is_empty() && h.iter().all(|n| (1..=8).contains(n)))
                    .ok_or("--hosts needs a list of host counts from 1 to 8, e.g. 1,2,4")?;
            }
            "postgres" => args.kinds.push(ServerKind::Postgres),
            "redis" => args.kinds.push(ServerKind::Redis),
            "rabbitmq" => args.kinds.push(ServerKind::Rabbitmq),
            _ => return Err(USAGE.into()),
        }
    }
    if args.kinds.is_empty() {
        args.kinds = vec![
            ServerKind::Postgres,
            ServerKind::Redis,
            ServerKind::Rabbitmq,
        ];
    }
    Ok(args)
}

/// The 1-minute load average (other work on the machine skews every figure).
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let worker = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("chaos-worker")))
        .filter(|p| p.exists());
    let Some(worker) = worker else {
        eprintln!(
            "scale: `chaos-worker` is not next to this binary; build both: cargo build --release -p courier-chaos"
        );
        return ExitCode::from(2);
    };
    if let Some(why) = courier_chaos::hosts::unavailable() {
        eprintln!("scale: cannot make network-namespace hosts here: {why}; run it as root");
        return ExitCode::from(2);
    }
    let most = args.hosts.iter().copied().max().unwrap_or(1);
    let hosts = match Hosts::up("crh", "10.231.77", most, &args.kinds) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("scale: {e:#}");
            return ExitCode::from(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("courier-scale-{:08x}", fastrand::u32(..)));
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        eprintln!("scale: cannot start the runtime");
        return ExitCode::from(1);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("scale: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let load_before = load();
    let mut samples: Vec<Sample> = Vec::new();
    let mut failed = false;
    for &kind in &args.kinds {
        // A warm-up (page cache, server caches, scripts), not reported.
        if let Err(e) = runtime.block_on(measure(&hosts, kind, 1, 2_000, &worker, &dir)) {
            eprintln!(
                "scale: {} warm-up failed: {e:#} (logs in {})",
                kind.name(),
                dir.display()
            );
            failed = true;
            continue;
        }
        for &n in &args.hosts {
            let mut rounds = Vec::new();
            for _ in 0..args.rounds {
                // A quiet second between measurements: the last one's backends and acks settle.
                std::thread::sleep(Duration::from_secs(1));
                match runtime.block_on(measure(&hosts, kind, n, args.messages, &worker, &dir)) {
                    Ok(s) => {
                        eprintln!(
                            "scale: {} x{n}: {:.0} messages/s, handled {:?}, starts {:?}, shares {:?}",
                            kind.name(),
                            s.rate(),
                            s.handled,
                            s.starts,
                            s.shares
                        );
                        rounds.push(s);
                    }
                    Err(e) => {
                        eprintln!(
                            "scale: {} x{n} failed: {e:#} (logs in {})",
                            kind.name(),
                            dir.display()
                        );
                        failed = true;
                    }
                }
            }
            // The median round by rate.
            rounds.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
            let mid = rounds.len() / 2;
            if let Some(s) = rounds.into_iter().nth(mid) {
                samples.push(s);
            }
        }
    }
    println!(
        "{} messages per measurement (median of {} rounds), one `consume` (defaults) per host, \
         {cores} cores, load average {load_before} before and {} after:\n",
        args.messages,
        args.rounds,
        load()
    );
    print!("{}", table(&samples, cores));
    drop(hosts);
    if failed {
        return ExitCode::from(1);
    }
    let _ = std::fs::remove_dir_all(&dir);
    ExitCode::SUCCESS
}
