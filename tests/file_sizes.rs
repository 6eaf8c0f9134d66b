//! No source file in `crates/*/src` holds more than 600 lines of non-test code (everything
//! before a trailing `#[cfg(test)]` module): one concept per file.

use std::path::{Path, PathBuf};

/// The most non-test lines a file may hold.
const LIMIT: usize = 600;

/// Files over the limit that are being split where other work on them lands (each is named
/// here until it is, and the test fails once one is under the limit, so that it leaves the list).
const BEING_SPLIT: &[&str] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `text` before its `#[cfg(test)]` module (at the start of a line).
fn non_test_lines(text: &str) -> usize {
    text.lines()
        .take_while(|line| *line != "#[cfg(test)]")
        .count()
}

#[test]
fn no_source_file_is_over_600_non_test_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        let src = krate.expect("a directory entry").path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(files.len() > 100, "only {} files found", files.len());
    let mut over = Vec::new();
    let mut split = Vec::new();
    for path in files {
        let name = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).expect("read the file");
        let lines = non_test_lines(&text);
        match (lines > LIMIT, BEING_SPLIT.contains(&name.as_str())) {
            (true, false) => over.push(format!("{name}: {lines} lines")),
            (false, true) => split.push(name),
            _ => {}
        }
    }
    assert!(
        over.is_empty(),
        "over {LIMIT} non-test lines (split them, one concept per file): {over:#?}"
    );
    split.extend(
        BEING_SPLIT
            .iter()
            .filter(|name| !root.join(name).exists())
            .map(|name| (*name).to_owned()),
    );
    assert!(
        split.is_empty(),
        "under {LIMIT} lines now, or gone: take them out of BEING_SPLIT: {split:#?}"
    );
}

#[test]
fn a_test_module_does_not_count() {
    let text = "fn a() {}\nfn b() {}\n#[cfg(test)]\nmod tests {\n    fn c() {}\n}\n";
    assert_eq!(non_test_lines(text), 2);
}
