//! `chaos-worker`: the `courier` command line plus the chaos suite's message type `chaos.item`
//! (recorded in the sink named by `CHAOS_SINK`), the flow-control test's `chaos.keyed` and the `chaos` agent, beside the built-in
//! `scripted` agent, and the scale measurement's `scale.tick` (a no-op handler). The harness
//! starts it as `chaos-worker consume --config FILE`.

use std::process::ExitCode;
use std::sync::Arc;

use courier_chaos::{ChaosAgent, ChaosItem, ScaleTick};
use courier_core::HandlerError;

fn main() -> ExitCode {
    let code = courier_cli::App::new()
        .handler_fn("chaos.record", |m: Arc<ChaosItem>| async move {
            courier_chaos::sink::record_handled(m.id).await
        })
        .handler_fn(
            "chaos.keyed",
            |m: Arc<courier_chaos::keyed::KeyedItem>| async move {
                courier_chaos::keyed::handle(&m).await
            },
        )
        .handler_fn("scale.noop", |_: Arc<ScaleTick>| async {
            courier_chaos::agent::record_tick();
            Ok::<(), HandlerError>(())
        })
        .agent("chaos", ChaosAgent)
        .run();
    if let Some(path) = std::env::var_os(courier_chaos::agent::TICKS_ENV) {
        let ticks = courier_chaos::agent::ticks();
        let text: String = ticks.iter().map(|t| format!("{t}\n")).collect();
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("chaos-worker: cannot write {}: {e}", path.to_string_lossy());
        }
    }
    code
}
