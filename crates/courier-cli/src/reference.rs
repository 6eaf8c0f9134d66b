//! docs/src/reference/cli.md, generated from the clap definitions: the test fails when the page
//! is stale and says how to regenerate it.

use clap::{Command, CommandFactory};

use crate::cli::Cli;

/// Where the page lives, from this crate.
const PAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/src/reference/cli.md"
);

/// The command that rewrites the page.
const REGENERATE: &str = "COURIER_UPDATE_DOCS=1 cargo test -p courier-cli --lib reference";

/// Hides environment values (a `COURIER_DASHBOARD_TOKEN` set where the page is generated).
fn without_env_values(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cmd = cmd.mut_args(|a| a.hide_env_values(true));
    for name in names {
        cmd = cmd.mut_subcommand(name, without_env_values);
    }
    cmd
}

fn section(out: &mut String, cmd: &mut Command, path: &str, depth: usize) {
    let help = cmd.render_long_help().to_string();
    out.push_str(&format!("{} `{path}`\n\n```text\n", "#".repeat(depth)));
    out.push_str(help.trim_end());
    out.push_str("\n```\n\n");
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        section(out, sub, &sub_path, (depth + 1).min(4));
    }
}

/// The page's text.
fn markdown() -> String {
    let mut cmd = without_env_values(Cli::command());
    cmd.build();
    let mut out = format!(
        "# Command-line reference\n\n\
         <!-- Generated from the clap definitions in crates/courier-cli/src/cli.rs by\n     \
         `{REGENERATE}`: do not edit by hand. -->\n\n\
         Every command and flag of `courier`, as `courier help COMMAND` prints it. Exit codes: 0 \
         ok, 1 runtime failure, 2 usage or configuration error (naming the bad key or flag), 130 \
         a `consume` forced to exit by a second SIGINT/SIGTERM. `--format json` is the scripting \
         interface of every command that prints data.\n\n"
    );
    section(&mut out, &mut cmd, "courier", 2);
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[test]
fn the_cli_reference_page_is_up_to_date() {
    let generated = markdown();
    if std::env::var_os("COURIER_UPDATE_DOCS").is_some() {
        std::fs::write(PAGE, &generated).expect("docs/src/reference/cli.md is writable");
        return;
    }
    let page = std::fs::read_to_string(PAGE).unwrap_or_default();
    assert!(
        page == generated,
        "docs/src/reference/cli.md is stale (the clap definitions changed): regenerate it with\n  \
         {REGENERATE}"
    );
}

/// The configuration reference shows the embedded default as it is.
#[test]
fn the_configuration_reference_shows_the_embedded_default_as_it_is() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/src/operations/config.md"
    );
    let page = std::fs::read_to_string(path).expect("the configuration reference");
    let embedded: Vec<&str> = crate::EMBEDDED_CONFIG
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect();
    let block = format!("```toml\n{}\n```", embedded.join("\n").trim());
    assert!(
        page.contains(&block),
        "docs/src/operations/config.md must show courier_cli::EMBEDDED_CONFIG as it is:\n{block}"
    );
}
