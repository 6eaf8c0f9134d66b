//! `courier setup [TRANSPORT...]`: create tables / queues / streams for every transport and the
//! run store, or for the named transports only (idempotent).

use std::collections::BTreeMap;

use crate::context::Ctx;
use crate::error::CliResult;

pub(crate) async fn run(ctx: &Ctx<'_>, only: &[String]) -> CliResult {
    ctx.check_transports(only)?;
    let transports = if only.is_empty() {
        ctx.connect().await?
    } else {
        // Only these are connected: a transport that sets itself up on connect must not touch
        // the others.
        let mut config = ctx.config.clone();
        config.transports.retain(|name, _| only.contains(name));
        config
            .connect(&ctx.app.factories, ctx.registry.clone())
            .await?
    };
    let mut done: BTreeMap<String, (&str, Vec<String>)> = BTreeMap::new();
    for (name, transport) in transports.all() {
        let state = match transport.as_setup() {
            Some(setup) => ("ready", setup.setup_report().await?),
            None => ("nothing to set up", Vec::new()),
        };
        done.insert(name.clone(), state);
    }
    #[cfg(feature = "runs")]
    let runs = if only.is_empty() {
        crate::runs::setup(ctx).await?
    } else {
        None
    };
    #[cfg(not(feature = "runs"))]
    let runs: Option<(String, Vec<String>)> = None;
    if ctx.json() {
        // `transports` and `runs` keep their first shape; `applied` names the migrations.
        let states: BTreeMap<&String, &str> = done
            .iter()
            .map(|(name, (state, _))| (name, *state))
            .collect();
        let mut applied: BTreeMap<String, &[String]> = done
            .iter()
            .map(|(name, (_, applied))| (name.clone(), applied.as_slice()))
            .collect();
        if let Some((_, list)) = &runs {
            applied.insert("runs".to_owned(), list);
        }
        return ctx.print_json(&serde_json::json!({
            "transports": states,
            "runs": runs.as_ref().map(|(store, _)| store),
            "applied": applied,
        }));
    }
    for (name, (state, applied)) in &done {
        println!("transport {name}: {state}{}", applied_text(applied));
    }
    if let Some((store, applied)) = runs {
        println!("runs store {store}: ready{}", applied_text(&applied));
    }
    Ok(())
}

/// `, applied 0001 ..., 0002 ...` or `, up to date`.
fn applied_text(applied: &[String]) -> String {
    if applied.is_empty() {
        ", up to date".to_owned()
    } else {
        format!(", applied {}", applied.join(", "))
    }
}
