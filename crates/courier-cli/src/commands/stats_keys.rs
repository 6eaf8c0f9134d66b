//! `courier stats --keys [TRANSPORT...]`: per concurrency key of each keyed queue, in flight /
//! max and queued, the [`TOP`] busiest keys and the rest summed as `other` (the same bounded
//! set a metric would export). Transports that are not keyed queues are left out.

use std::collections::BTreeMap;

use courier_core::KeyLoads;

use crate::context::Ctx;
use crate::error::CliResult;
use crate::table::Table;

/// The keys shown per queue before the rest is summed as `other`.
pub(crate) const TOP: usize = courier_core::metrics::KEY_GAUGE_TOP;

pub(crate) async fn run(ctx: &Ctx<'_>, names: &[String]) -> CliResult {
    ctx.check_transports(names)?;
    let transports = ctx.connect().await?;
    let mut loads: BTreeMap<String, KeyLoads> = BTreeMap::new();
    for (name, transport) in transports.all() {
        if !names.is_empty() && !names.contains(name) {
            continue;
        }
        if let Some(keyed) = transport.as_keyed_queue() {
            loads.insert(name.clone(), keyed.key_loads(TOP).await?);
        }
    }
    if ctx.json() {
        return ctx.print_json(&loads);
    }
    let mut table = Table::new(&["TRANSPORT", "KEY", "IN FLIGHT", "QUEUED"]);
    for (name, l) in &loads {
        let in_flight = |n: u64| match l.max {
            Some(max) => format!("{n} / {max}"),
            None => n.to_string(),
        };
        for k in &l.keys {
            table.row(vec![
                name.clone(),
                k.key.clone(),
                in_flight(k.in_flight),
                k.queued.to_string(),
            ]);
        }
        if let Some(other) = &l.other {
            table.row(vec![
                name.clone(),
                format!("other ({} keys)", l.other_keys),
                other.in_flight.to_string(),
                other.queued.to_string(),
            ]);
        }
    }
    print!("{}", table.render());
    Ok(())
}
