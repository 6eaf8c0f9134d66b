//! `courier stats [TRANSPORT...]`: message counts per transport.

use std::collections::BTreeMap;

use crate::context::Ctx;
use crate::error::CliResult;
use crate::table::Table;

pub(crate) async fn run(ctx: &Ctx<'_>, names: &[String]) -> CliResult {
    ctx.check_transports(names)?;
    let transports = ctx.connect().await?;
    let mut counts: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for (name, transport) in transports.all() {
        if !names.is_empty() && !names.contains(name) {
            continue;
        }
        let count = match transport.as_message_count() {
            Some(c) => Some(c.message_count().await?),
            None => None,
        };
        counts.insert(name.clone(), count);
    }
    if ctx.json() {
        return ctx.print_json(&counts);
    }
    let mut table = Table::new(&["TRANSPORT", "MESSAGES"]);
    for (name, count) in &counts {
        table.row(vec![
            name.clone(),
            count.map_or_else(|| "n/a".to_owned(), |c| c.to_string()),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}
