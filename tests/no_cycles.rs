//! No circle of files inside a crate: no module uses another that, directly or through others,
//! uses the first.
//!
//! Reads the sources of every crate (`crates/*/src` and the root's `src`), follows the `mod`
//! declarations from each crate root (`lib.rs`, `main.rs`, `bin/*.rs`) and builds a graph of
//! files: an edge from a file to each file whose items it names, through a `use` or a path
//! (`crate::a::b`, `super::x`, `child::y`). A `pub use` is wiring, not a use: a name it
//! re-exports is followed to the file that defines it, so `use crate::Envelope` is an edge to
//! `envelope.rs`, not to `lib.rs`. A module's use of its own parent (`super::Worker` in
//! `worker/run.rs`) is not an edge either: the parent is the front of the concept, the files
//! beside it its parts. Test code (`#[cfg(test)]` items, `tests` modules) is left
//! out. Every strongly connected set of more than one file is a circle.
//!
//! Needs nothing but the standard library; runs in a few milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Crates whose circles are known and being taken apart elsewhere: their circles are reported,
/// not failed on. Empty it once they are gone (the test fails while an entry has no circle
/// left, so the list cannot go stale).
const ALLOWED: &[&str] = &[];

#[test]
fn no_module_uses_a_module_that_uses_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<(String, PathBuf)> = vec![("courier".to_owned(), root.join("src"))];
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("src").is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a crate directory has a UTF-8 name")
            .to_owned();
        crates.push((name, dir.join("src")));
    }
    assert!(crates.len() > 5, "found the workspace's crates: {crates:?}");

    let mut failures = Vec::new();
    let mut allowed_seen = BTreeSet::new();
    let mut files_read = 0;
    for (name, src) in &crates {
        let circles = circles_of_crate(src, &mut files_read);
        for circle in circles {
            let files: Vec<String> = circle
                .iter()
                .map(|p| p.strip_prefix(root).unwrap_or(p).display().to_string())
                .collect();
            if ALLOWED.contains(&name.as_str()) {
                allowed_seen.insert(name.clone());
                eprintln!("allowed circle in {name}: {}", files.join(" <-> "));
            } else {
                failures.push(format!("{name}: {}", files.join(" <-> ")));
            }
        }
    }
    assert!(files_read > 100, "read the sources: {files_read} files");
    for name in ALLOWED {
        assert!(
            allowed_seen.contains(*name),
            "{name} has no circle left: remove it from ALLOWED in tests/no_cycles.rs"
        );
    }
    assert!(
        failures.is_empty(),
        "circles of files (move the shared piece down into a module both use):\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_circle_through_a_use_and_a_path_is_found() {
    let dir = std::env::temp_dir().join(format!("courier-no-cycles-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("b")).expect("a scratch directory");
    let write = |file: &str, text: &str| fs::write(src.join(file), text).expect("a scratch file");
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\npub use a::A;\npub use b::{B, inner::Deep};\n",
    );
    // a -> b (through the root's re-export of `Deep`), b/inner -> a (through `crate::A`);
    // c only uses a and the root's re-exports, and a `pub use` of c's is wiring.
    write("a.rs", "use crate::Deep;\npub struct A(Deep);\n");
    write("b/mod.rs", "pub mod inner;\npub struct B;\n");
    write(
        "b/inner.rs",
        "// use crate::c::C;\npub struct Deep;\nfn f() -> crate::A { todo!(\"crate::c\") }\n",
    );
    write(
        "c.rs",
        "use super::a::A;\npub use crate::B;\n#[cfg(test)]\nmod tests { use crate::c; }\n",
    );
    let mut read = 0;
    let circles = circles_of_crate(&src, &mut read);
    let _ = fs::remove_dir_all(&dir);
    assert_eq!(read, 5);
    let names: Vec<Vec<String>> = circles
        .iter()
        .map(|c| {
            c.iter()
                .map(|p| p.strip_prefix(&src).unwrap_or(p).display().to_string())
                .collect()
        })
        .collect();
    assert_eq!(names, [vec!["a.rs".to_owned(), "b/inner.rs".to_owned()]]);
}

/// One source file: a module of the crate.
#[derive(Debug, Default)]
struct Module {
    path: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Items it defines (structs, fns, traits, ...).
    defines: BTreeSet<String>,
    /// Names it brings in with `use` (public or not): name -> path.
    aliases: BTreeMap<String, Vec<String>>,
    /// Paths of its `use *` globs.
    globs: Vec<Vec<String>>,
    /// Paths it uses: its private `use`s and the paths in its code.
    uses: Vec<Vec<String>>,
}

/// The circles (sets of files, each sorted) among the modules reachable from the crate roots
/// in `src`.
fn circles_of_crate(src: &Path, files_read: &mut usize) -> Vec<Vec<PathBuf>> {
    let mut roots = Vec::new();
    for root in ["lib.rs", "main.rs"] {
        if src.join(root).is_file() {
            roots.push(src.join(root));
        }
    }
    if let Ok(bins) = fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = bins.filter_map(|e| e.ok().map(|e| e.path())).collect();
        bins.sort();
        roots.extend(
            bins.into_iter()
                .filter(|p| p.extension() == Some("rs".as_ref())),
        );
    }
    let mut circles = BTreeSet::new();
    for root in roots {
        let mut modules = Vec::new();
        let dir = root.parent().unwrap_or(src).to_owned();
        load(&root, &dir, None, None, &mut modules, files_read);
        for circle in strongly_connected(&modules) {
            let mut files: Vec<PathBuf> = circle.iter().map(|&m| modules[m].path.clone()).collect();
            files.sort();
            circles.insert(files);
        }
    }
    circles.into_iter().collect()
}

/// Reads `file` and, through its `mod` declarations, its descendants into `modules`. `dir` is
/// where its children's files are.
fn load(
    file: &Path,
    dir: &Path,
    parent: Option<usize>,
    name: Option<&str>,
    modules: &mut Vec<Module>,
    files_read: &mut usize,
) -> usize {
    let text = fs::read_to_string(file).unwrap_or_default();
    *files_read += 1;
    let code = without_tests(&strip(&text));
    let id = modules.len();
    modules.push(Module {
        path: file.to_owned(),
        parent,
        ..Module::default()
    });
    let (code, declared) = parse(&code, &mut modules[id]);
    let child_dir = match name {
        None => dir.to_owned(),
        Some(_) if file.file_name() == Some("mod.rs".as_ref()) => dir.to_owned(),
        Some(n) => dir.join(n),
    };
    for child in declared {
        let flat = child_dir.join(format!("{child}.rs"));
        let nested = child_dir.join(&child).join("mod.rs");
        let (path, dir) = if flat.is_file() {
            (flat, child_dir.clone())
        } else if nested.is_file() {
            (nested, child_dir.join(&child))
        } else {
            continue;
        };
        let c = load(&path, &dir, Some(id), Some(&child), modules, files_read);
        modules[id].children.insert(child, c);
    }
    collect_paths(&code, id, modules);
    id
}

/// The code without comments, strings and character literals.
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                out.push(' ');
            }
            b'r' if (b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"'))
                && (i == 0 || !is_ident(b[i - 1])) =>
            {
                let mut j = i + 1;
                while b.get(j) == Some(&b'#') {
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let hashes = j - i - 1;
                j += 1;
                while j < b.len() {
                    if b[j] == b'"'
                        && b[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&c| c == b'#')
                            .count()
                            == hashes
                    {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => {
                i += 3;
                out.push_str("' '");
            }
            c => {
                // Multi-byte characters pass through whole.
                let len = match c {
                    0..0x80 => 1,
                    0xC0..0xE0 => 2,
                    0xE0..0xF0 => 3,
                    _ => 4,
                };
                out.push_str(text.get(i..i + len).unwrap_or(" "));
                i += len;
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Where the item that starts at or after `from` ends: past its `;` or its `{ ... }` block.
fn item_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0_i32;
    while i < b.len() {
        match b[i] {
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => {
                depth -= 1;
                if depth == 0 && b[i] == b'}' {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The code without `#[cfg(test)]` items (a `tests` module, a test-only `use`).
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        // Further attributes of the same item.
        let mut skip = after.len() - after.trim_start().len();
        while after[skip..].starts_with("#[") {
            let close = after[skip..]
                .find(']')
                .map_or(after.len(), |c| skip + c + 1);
            skip = close + (after[close..].len() - after[close..].trim_start().len());
        }
        let end = skip + item_end(&after.as_bytes()[skip..], 0);
        rest = &after[end.min(after.len())..];
    }
    out.push_str(rest);
    out
}

/// Reads the `use` statements, `mod` declarations and item definitions of a module; returns
/// the code without its `use` statements, and the modules it declares.
fn parse(code: &str, module: &mut Module) -> (String, Vec<String>) {
    let b = code.as_bytes();
    let mut rest = String::with_capacity(code.len());
    let mut declared = Vec::new();
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i != 0 && is_ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let word_end = (i..b.len()).find(|&j| !is_ident(b[j])).unwrap_or(b.len());
        let word = &code[i..word_end];
        let next = code[word_end..].trim_start();
        let next_word: String = next
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        match word {
            "use" => {
                let end = code[word_end..]
                    .find(';')
                    .map_or(b.len(), |e| word_end + e + 1);
                let public = is_public(&code[..i]);
                let tree = code[word_end..end].trim_end_matches(';');
                for (path, name) in use_tree(tree) {
                    match name {
                        None => {
                            module.globs.push(path.clone());
                            if !public {
                                module.uses.push(path);
                            }
                        }
                        Some(name) => {
                            if !public {
                                module.uses.push(path.clone());
                            }
                            if name != "_" {
                                module.aliases.insert(name, path);
                            }
                        }
                    }
                }
                rest.push_str(&code[last..i]);
                last = end;
                i = end;
                continue;
            }
            "mod" if !next_word.is_empty() => {
                let after = next[next_word.len()..].trim_start();
                if after.starts_with(';') {
                    declared.push(next_word.clone());
                }
            }
            "struct" | "enum" | "fn" | "trait" | "type" | "const" | "static" | "union"
                if !next_word.is_empty() =>
            {
                module.defines.insert(next_word.clone());
            }
            "macro_rules" => {
                let name = next.trim_start_matches('!').trim_start();
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                module.defines.insert(name);
            }
            _ => {}
        }
        i = word_end;
    }
    rest.push_str(&code[last.min(code.len())..]);
    (rest, declared)
}

/// Whether the item whose text starts after `before` is `pub` or `pub(...)`.
fn is_public(before: &str) -> bool {
    let mut before = before.trim_end();
    if before.ends_with(')') {
        let Some(open) = before.rfind('(') else {
            return false;
        };
        before = before[..open].trim_end();
    }
    before.ends_with("pub")
        && !before[..before.len() - 3]
            .bytes()
            .next_back()
            .is_some_and(is_ident)
}

/// The paths of a use tree (`a::{b, c::d as e, f::*}`), each with the name it brings in
/// (`None` for a glob).
fn use_tree(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let mut out = Vec::new();
    expand(tree.trim(), &[], &mut out);
    out
}

fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = split_path(&tree[..open]);
        let mut path = prefix.to_vec();
        path.extend(head);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (j, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..j], &path, out);
                    start = j + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &path, out);
        return;
    }
    let (path_text, rename) = match tree.split_once(" as ") {
        Some((p, r)) => (p, Some(r.trim().to_owned())),
        None => (tree, None),
    };
    let mut path = prefix.to_vec();
    path.extend(split_path(path_text));
    if path.last().is_some_and(|l| l == "*") {
        path.pop();
        out.push((path, None));
        return;
    }
    if path.last().is_some_and(|l| l == "self") {
        path.pop();
    }
    let name = rename.or_else(|| path.last().cloned());
    out.push((path, name));
}

fn split_path(text: &str) -> Vec<String> {
    text.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Adds the paths in the code (`crate::a::b`, `super::x`, `child::y`) to the module's uses.
fn collect_paths(code: &str, id: usize, modules: &mut [Module]) {
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) || (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let end = (j..b.len()).find(|&k| !is_ident(b[k])).unwrap_or(b.len());
            segs.push(code[j..end].to_owned());
            if code[end..].starts_with("::") && end + 2 < b.len() && is_ident(b[end + 2]) {
                j = end + 2;
            } else {
                j = end;
                break;
            }
        }
        if segs.len() > 1 {
            let first = segs[0].as_str();
            if matches!(first, "crate" | "super" | "self")
                || modules[id].children.contains_key(first)
            {
                modules[id].uses.push(segs);
            }
        }
        i = j.max(i + 1);
    }
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Module(usize),
    Item(usize),
}

/// The file a path used in module `from` leads to, if it is of this crate.
fn resolve(modules: &[Module], from: usize, path: &[String], depth: u32) -> Option<Target> {
    if depth > 24 || path.is_empty() {
        return None;
    }
    let mut at = from;
    let mut rest = path;
    match path[0].as_str() {
        "crate" => {
            while let Some(p) = modules[at].parent {
                at = p;
            }
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                at = modules[at].parent?;
                rest = &rest[1..];
            }
        }
        first if modules[at].children.contains_key(first) => {}
        first => {
            // A name this module brought in with a `use` of its own.
            let alias = modules[at].aliases.get(first)?;
            if alias.first().is_some_and(|a| a == first) {
                return None;
            }
            return walk(modules, at, alias, depth + 1, &path[1..]);
        }
    }
    walk_from(modules, at, rest, depth)
}

/// Resolves `alias` from `at`, then the rest of the path from where it led.
fn walk(
    modules: &[Module],
    at: usize,
    alias: &[String],
    depth: u32,
    rest: &[String],
) -> Option<Target> {
    match resolve(modules, at, alias, depth)? {
        Target::Module(m) => walk_from(modules, m, rest, depth),
        item => Some(item),
    }
}

fn walk_from(modules: &[Module], mut at: usize, path: &[String], depth: u32) -> Option<Target> {
    for (k, seg) in path.iter().enumerate() {
        let m = &modules[at];
        if let Some(&c) = m.children.get(seg) {
            at = c;
            continue;
        }
        if m.defines.contains(seg) {
            return Some(Target::Item(at));
        }
        if let Some(alias) = m.aliases.get(seg) {
            return walk(modules, at, alias, depth + 1, &path[k + 1..]);
        }
        for glob in &m.globs {
            if let Some(Target::Module(g)) = resolve(modules, at, glob, depth + 1)
                && g != at
                && let Some(found) = walk_from(modules, g, &path[k..], depth + 1)
            {
                return Some(found);
            }
        }
        return Some(Target::Item(at));
    }
    Some(Target::Module(at))
}

/// Whether `ancestor` is a parent (or a parent's parent...) of `module`. A module's use of its
/// ancestors is not an edge: a folder's `mod.rs` is the front of its concept and the files
/// beside it its parts, which may use what the front defines (tower's `retry/future.rs` uses
/// `super::Retry`); a circle is between parts, or between concepts.
fn is_ancestor(modules: &[Module], ancestor: usize, module: usize) -> bool {
    let mut at = modules[module].parent;
    while let Some(p) = at {
        if p == ancestor {
            return true;
        }
        at = modules[p].parent;
    }
    false
}

/// The strongly connected sets of more than one module (Tarjan).
fn strongly_connected(modules: &[Module]) -> Vec<Vec<usize>> {
    let edges: Vec<BTreeSet<usize>> = (0..modules.len())
        .map(|m| {
            modules[m]
                .uses
                .iter()
                .filter_map(|p| resolve(modules, m, p, 0))
                .map(|t| match t {
                    Target::Module(x) | Target::Item(x) => x,
                })
                .filter(|&x| x != m && !is_ancestor(modules, x, m))
                .collect()
        })
        .collect();
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        edges: &edges,
        index: vec![None; modules.len()],
        low: vec![0; modules.len()],
        on_stack: vec![false; modules.len()],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..modules.len() {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}
