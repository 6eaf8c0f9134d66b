//! `chaos-worker`: the `courier` command line plus the chaos suite's message type `chaos.item`
//! (recorded in the sink named by `CHAOS_SINK`) and the `chaos` agent, beside the built-in
//! `scripted` agent. The harness starts it as `chaos-worker consume --config FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use courier_chaos::{ChaosAgent, ChaosItem};

fn main() -> ExitCode {
    courier_cli::App::new()
        .handler_fn("chaos.record", |m: Arc<ChaosItem>| async move {
            courier_chaos::sink::record_handled(m.id).await
        })
        .agent("chaos", ChaosAgent)
        .run()
}
