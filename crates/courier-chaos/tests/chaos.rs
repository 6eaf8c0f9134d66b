//! The short chaos suite on every transport: workers SIGKILLed every 2 s, servers killed and
//! restarted twice, poison injected; nothing lost, duplicates bounded, every run terminal in
//! time with contiguous events and one owner at a time, the failure transport holds exactly the
//! poison.

use std::path::Path;

use courier_chaos::scenario::{Plan, Target, run};
use courier_chaos::server::missing_binaries;

#[test]
#[ignore = "needs the server binaries: run via scripts/test"]
fn nothing_is_lost_or_stuck_when_workers_and_servers_are_killed() {
    let missing: Vec<String> = Target::ALL
        .iter()
        .filter_map(|t| t.server())
        .flat_map(missing_binaries)
        .collect();
    assert!(
        missing.is_empty(),
        "the chaos suite starts its own servers and needs their binaries: missing {}; \
         install them (scripts/services installs the Debian packages; PostgreSQL's initdb and \
         postgres must be reachable as /usr/local/bin/initdb and /usr/local/bin/postgres)",
        missing.join(", ")
    );
    let worker = Path::new(env!("CARGO_BIN_EXE_chaos-worker"));
    let plan = Plan::short();
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        panic!("cannot start a tokio runtime");
    };
    let mut summaries = Vec::new();
    let mut failures = Vec::new();
    for target in Target::ALL {
        match rt.block_on(run(target, &plan, worker)) {
            Ok(report) => {
                print!("{}", report.details());
                summaries.push(report.summary());
                if !report.failures.is_empty() {
                    failures.push(report.details());
                }
            }
            Err(e) => {
                summaries.push(format!("chaos {} harness error: {e:#}", target.name()));
                failures.push(format!("[{}] harness error: {e:#}", target.name()));
            }
        }
    }
    for line in &summaries {
        println!("{line}");
    }
    assert!(
        failures.is_empty(),
        "chaos checks failed:\n{}\n{}",
        summaries.join("\n"),
        failures.join("\n")
    );
}
