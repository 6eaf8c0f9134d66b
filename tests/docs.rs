//! The README and the book (docs/src) cannot drift from the code:
//!
//! - every ```toml block loads with the real `Config` (and its `[runs]` table with `RunsConfig`,
//!   its `[agents.NAME]` tables with `AgentConfig`), unless it is marked ```toml,fragment, which
//!   is still parsed as TOML;
//! - every internal link (a file, and a `#heading` in it) exists, and every page is in
//!   SUMMARY.md;
//! - every file with a ```rust block is compiled as a doctest (listed in src/doctests.rs).

use std::path::{Path, PathBuf};

use courier::agent::AgentConfig;
use courier::config::Config;
use courier::runs::RunsConfig;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// README.md and every page of the book.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![Path::new(ROOT).join("README.md")];
    let mut dirs = vec![Path::new(ROOT).join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A fenced block: its info string, its text and the line it starts on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.as_mut() {
            None if trimmed.starts_with("```") => {
                open = Some(Block {
                    info: trimmed.trim_start_matches('`').trim().to_owned(),
                    text: String::new(),
                    line: i + 1,
                });
            }
            None => {}
            Some(_) if trimmed.starts_with("```") => out.extend(open.take()),
            Some(block) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
        }
    }
    out
}

/// The values the documented `${VAR}`s stand for (secrets; everything else takes its default).
fn environment(var: &str) -> Option<String> {
    match var {
        "OPENAI_API_KEY" => Some("sk-documentation".into()),
        "COURIER_SIGNING_KEY" => Some("a documentation key of at least 32 bytes".into()),
        _ => None,
    }
}

/// Loads a complete configuration as `courier` does: the file, then `[runs]` and `[agents]`.
fn load(text: &str) -> Result<(), String> {
    let config = Config::parse_with(text, environment).map_err(|e| e.to_string())?;
    if let Some(table) = &config.runs {
        let runs: RunsConfig = table.deserialize().map_err(|e| format!("[runs]: {e}"))?;
        runs.validate().map_err(|e| e.to_string())?;
    }
    for (name, table) in &config.agents.0 {
        AgentConfig::from_table(name, table).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn every_toml_block_loads_with_the_real_config_types() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let markdown = std::fs::read_to_string(&file).expect("readable");
        for block in blocks(&markdown) {
            let mut tags = block.info.split(',').map(str::trim);
            if tags.next() != Some("toml") {
                continue;
            }
            checked += 1;
            let fragment = tags.any(|t| t == "fragment");
            let result = if fragment {
                toml::from_str::<toml::Table>(&block.text)
                    .map(drop)
                    .map_err(|e| e.to_string())
            } else {
                load(&block.text)
            };
            if let Err(e) = result {
                let kind = if fragment { "TOML" } else { "a configuration" };
                failures.push(format!(
                    "{}:{}: not {kind} (mark a partial example ```toml,fragment): {e}",
                    relative(&file),
                    block.line
                ));
            }
        }
    }
    assert!(
        checked > 10,
        "found only {checked} TOML blocks: is docs/src there?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The anchor mdBook gives a heading: lowercase, spaces to `-`, other punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` links outside code, the line they are on.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut fence = false;
    let mut out = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Inline code may hold `](`: drop it first.
        let text: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_internal_link_and_anchor_exists() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let markdown = std::fs::read_to_string(&file).expect("readable");
        for (line, target) in links(&markdown) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a parent").join(path)
            };
            let at = format!("{}:{line}: `{target}`", relative(&file));
            if !dest.exists() {
                failures.push(format!("{at}: no such file"));
                continue;
            }
            if !anchor.is_empty() {
                let page = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&page).iter().any(|a| a == anchor) {
                    failures.push(format!("{at}: no heading `#{anchor}` there"));
                }
            }
        }
    }
    assert!(checked > 20, "found only {checked} internal links");
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_page_is_in_the_summary() {
    let src = Path::new(ROOT).join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("SUMMARY.md");
    let listed: Vec<String> = links(&summary).into_iter().map(|(_, l)| l).collect();
    let orphans: Vec<String> = documents()
        .iter()
        .filter_map(|f| f.strip_prefix(&src).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p != "SUMMARY.md" && !listed.contains(p))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages not in docs/src/SUMMARY.md: {orphans:?}"
    );
}

#[test]
fn every_file_with_rust_blocks_is_compiled_as_a_doctest() {
    let facade = include_str!("../src/doctests.rs");
    let cli = include_str!("../crates/courier-cli/src/doctests.rs");
    let missing: Vec<String> = documents()
        .into_iter()
        .filter(|f| {
            let markdown = std::fs::read_to_string(f).expect("readable");
            blocks(&markdown)
                .iter()
                .any(|b| b.info.split(',').next().map(str::trim) == Some("rust"))
        })
        .map(|f| relative(&f))
        .filter(|r| {
            !facade.contains(&format!("\"../{r}\"")) && !cli.contains(&format!("\"../../../{r}\""))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files with ```rust blocks missing from src/doctests.rs: {missing:?}"
    );
}

#[test]
fn no_rust_block_is_ignored() {
    let ignored: Vec<String> = documents()
        .into_iter()
        .flat_map(|f| {
            let markdown = std::fs::read_to_string(&f).expect("readable");
            blocks(&markdown)
                .into_iter()
                .filter(|b| b.info.starts_with("rust") && b.info.contains("ignore"))
                .map(move |b| format!("{}:{}", relative(&f), b.line))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        ignored.is_empty(),
        "```rust,ignore blocks (use no_run): {ignored:?}"
    );
}

#[test]
fn the_readme_is_short_and_keeps_the_two_commands() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    assert!(
        readme.len() <= 12 * 1024,
        "README.md is {} bytes: at most 12 KB, the rest belongs in the book (docs/src)",
        readme.len()
    );
    for command in ["cargo run --release -- demo", "scripts/test"] {
        assert!(
            readme.lines().any(|l| l.starts_with(command)),
            "README.md must show `{command}` at the start of a line"
        );
    }
}

#[test]
fn the_readme_lists_every_example() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).expect("README.md");
    let missing: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("examples"))
        .expect("examples/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .filter(|name| !readme.contains(&format!("  - `{name}`: ")))
        .collect();
    assert!(
        missing.is_empty(),
        "examples missing from README.md's list (`  - `NAME`: what it shows`): {missing:?}"
    );
}
