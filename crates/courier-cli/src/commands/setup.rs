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

/// `courier setup --print-sql`: the complete DDL of every table the configuration needs, for
/// the application's own migration tool, connecting nothing. Per SQL transport (one table
/// printed once, whatever the queues on it): its messages table and the tables beside it; then
/// the run store's tables when runs are wired. Each set of tables is followed by the version
/// rows its `<table>_migrations` table gets, exactly as `courier setup` would record them, so
/// that transports with `auto_setup=false` find their schema complete.
pub(crate) fn print_sql(
    ctx: &Ctx<'_>,
    only: &[String],
    dialect: Option<&str>,
    table: Option<&str>,
) -> CliResult {
    #[cfg(feature = "sql")]
    {
        let sql = render_sql(ctx, only, dialect, table)?;
        print!("{sql}");
        Ok(())
    }
    #[cfg(not(feature = "sql"))]
    {
        let _ = (ctx, only, dialect, table);
        Err(crate::error::CliError::usage(
            "--print-sql: this build has no SQL support (features sqlite, postgres or mysql)",
        ))
    }
}

/// The script [`print_sql`] prints.
#[cfg(feature = "sql")]
fn render_sql(
    ctx: &Ctx<'_>,
    only: &[String],
    dialect: Option<&str>,
    table: Option<&str>,
) -> CliResult<String> {
    use courier_sql::{Dialect, SqlOptions, migrate};

    use crate::error::CliError;

    let forced = dialect
        .map(|d| {
            Dialect::from_scheme(d).map_err(|_| {
                CliError::usage(format!(
                    "--dialect: unknown database `{d}` (postgres, mysql or sqlite)"
                ))
            })
        })
        .transpose()?;
    if let Some(t) = table
        && !courier_sql::is_valid_identifier(t)
    {
        return Err(CliError::usage(format!(
            "--table: {}",
            courier_sql::invalid_table_name(t)
        )));
    }
    ctx.check_transports(only)?;
    let name_of = |d: Dialect| match d {
        Dialect::Postgres => "postgres",
        Dialect::Mysql => "mysql",
        _ => "sqlite",
    };
    let mut out = String::new();
    let mut printed: Vec<(Dialect, String)> = Vec::new();
    for name in ctx.config.transports.keys() {
        if !only.is_empty() && !only.contains(name) {
            continue;
        }
        let Some(dsn) = ctx.config.effective_dsn(name) else {
            continue;
        };
        let own = match Dialect::from_scheme(dsn.scheme()) {
            Ok(own) => own,
            // A pool handed over in code (`courier_sql::SqlPoolFactory`): its database is
            // known only when the application runs.
            Err(_) if dsn.scheme() == "pool" => forced.ok_or_else(|| {
                CliError::usage(format!(
                    "--print-sql: transport `{name}` runs on a pool handed over in code (`pool://`): name its database with --dialect"
                ))
            })?,
            Err(_) => continue,
        };
        let options = SqlOptions::from_dsn(&dsn)
            .map_err(|e| CliError::usage(format!("transport `{name}`: {e}")))?;
        let d = forced.unwrap_or(own);
        let t = table.unwrap_or(options.table()).to_owned();
        if printed.contains(&(d, t.clone())) {
            continue;
        }
        out.push_str(&format!(
            "-- transport `{name}`: table {t} and the tables beside it ({})\n",
            name_of(d)
        ));
        out.push_str(&migrate::transport_script(d, &t));
        out.push('\n');
        printed.push((d, t));
    }
    if printed.is_empty() && only.is_empty() && (table.is_some() || forced.is_some()) {
        let d = forced.ok_or_else(|| {
            CliError::usage("--print-sql: no SQL transport in the configuration: name the database with --dialect")
        })?;
        let t = table.unwrap_or(courier_sql::DEFAULT_TABLE);
        out.push_str(&format!(
            "-- table {t} and the tables beside it ({})\n",
            name_of(d)
        ));
        out.push_str(&migrate::transport_script(d, t));
        out.push('\n');
    }
    #[cfg(feature = "runs")]
    if only.is_empty() && crate::runs::enabled(ctx) {
        let config = crate::runs::settings(ctx)?;
        let dsn = crate::runs::store_dsn(config.store.as_deref());
        let d = match forced {
            Some(d) => d,
            None => Dialect::from_dsn(&dsn).map_err(|_| {
                CliError::usage(format!(
                    "runs.store: unsupported run store DSN `{}` (sqlite://, postgres://, mysql://)",
                    courier_core::redact(&dsn)
                ))
            })?,
        };
        let store = courier_runs::SqlRunStoreOptions::default();
        out.push_str(&format!(
            "-- run store: tables {} and {} ({})\n",
            store.runs_table,
            store.events_table,
            name_of(d)
        ));
        out.push_str(&migrate::script(
            d,
            &courier_runs::MIGRATIONS,
            &[
                ("{runs}", store.runs_table.as_str()),
                ("{events}", store.events_table.as_str()),
            ],
        ));
    }
    if out.is_empty() {
        return Err(CliError::usage(
            "--print-sql: nothing to print: no SQL transport or run store in this configuration (name one with --dialect and --table)",
        ));
    }
    Ok(out)
}
