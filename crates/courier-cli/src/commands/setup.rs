//! `courier setup`: create tables / queues / streams for every transport (idempotent).

use std::collections::BTreeMap;

use crate::context::Ctx;
use crate::error::CliResult;

pub(crate) async fn run(ctx: &Ctx<'_>) -> CliResult {
    let transports = ctx.connect().await?;
    let mut done: BTreeMap<String, &str> = BTreeMap::new();
    for (name, transport) in transports.all() {
        let state = match transport.as_setup() {
            Some(setup) => {
                setup.setup().await?;
                "ready"
            }
            None => "nothing to set up",
        };
        done.insert(name.clone(), state);
    }
    #[cfg(feature = "runs")]
    let runs = crate::runs::setup(ctx).await?;
    #[cfg(not(feature = "runs"))]
    let runs: Option<String> = None;
    if ctx.json() {
        return ctx.print_json(&serde_json::json!({ "transports": done, "runs": runs }));
    }
    for (name, state) in &done {
        println!("transport {name}: {state}");
    }
    if let Some(store) = runs {
        println!("runs store {store}: ready");
    }
    Ok(())
}
