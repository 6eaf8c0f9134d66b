//! `chaos`: runs the chaos scenario on each transport and prints one summary line per transport
//! plus every failed check. Exit 0 when every check passed, 1 otherwise, 2 on bad usage.
//!
//! ```text
//! chaos [--long] [--messages N] [--runs N] [TRANSPORT...]   (sqlite postgres mariadb redis rabbitmq nats)
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use courier_chaos::scenario::{Plan, Target};

const USAGE: &str = "usage: chaos [--long] [--messages N] [--runs N] [sqlite|postgres|mariadb|redis|rabbitmq|nats ...]";

fn parse() -> Result<(Plan, Vec<Target>), String> {
    let mut plan = Plan::short();
    let mut messages = None;
    let mut runs = None;
    let mut targets = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--long" => plan = Plan::long(),
            "--messages" => {
                messages = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .ok_or("--messages needs a number")?,
                )
            }
            "--runs" => {
                runs = Some(
                    args.next()
                        .and_then(|v| v.parse().ok())
                        .ok_or("--runs needs a number")?,
                )
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => targets.push(other.parse()?),
        }
    }
    if let Some(m) = messages {
        plan.messages = m;
    }
    if let Some(r) = runs {
        plan.runs = r;
    }
    if targets.is_empty() {
        targets = Target::ALL.to_vec();
    }
    Ok((plan, targets))
}

fn worker_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.join("chaos-worker");
    path.exists().then_some(path)
}

fn main() -> ExitCode {
    let (plan, targets) = match parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Some(worker) = worker_binary() else {
        eprintln!(
            "chaos: `chaos-worker` is not next to this binary; build both: cargo build --release -p courier-chaos"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut summaries = Vec::new();
    let mut ok = true;
    for target in targets {
        match runtime.block_on(courier_chaos::scenario::run(target, &plan, &worker)) {
            Ok(report) => {
                print!("{}", report.details());
                ok &= report.failures.is_empty();
                summaries.push(report.summary());
            }
            Err(e) => {
                ok = false;
                summaries.push(format!("chaos {:<9} harness error: {e:#}", target.name()));
            }
        }
    }
    println!();
    for line in &summaries {
        println!("{line}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
