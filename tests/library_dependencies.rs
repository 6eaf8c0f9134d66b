//! A library user gets a library: `courier`, with its default features or any set of transports,
//! pulls neither the command line's dependencies (clap, tracing-subscriber, the Prometheus
//! exporter) nor the dashboard's (axum, maud) nor the binary's C allocator (mimalloc), nor
//! OpenTelemetry without `otel`, and tokio gets no signal, process or multi-threaded runtime code
//! from Courier. The `courier` binary and all of those are the `courier-cli` package's. The run
//! layer alone (`courier-runs` without default features: the memory store) pulls no SQL.
//!
//! Runs `cargo tree --locked --offline` on this workspace, so it needs no network and fails when
//! the lock file would have to change.

use std::collections::BTreeSet;
use std::process::Command;

/// The dependency line the README's install section gives a library user.
const LIBRARY: &str = "sql,sqlite,runs";
/// Every transport and the run layer, still without the command line.
const EVERY_TRANSPORT: &str = "sql,sqlite,postgres,mysql,redis,amqp,runs";
/// What only the `courier` binary needs (its dashboard included).
const BINARY_ONLY: [&str; 8] = [
    "clap",
    "tracing-subscriber",
    "metrics-exporter-prometheus",
    "mimalloc",
    "courier-cli",
    "courier-dashboard",
    "axum",
    "maud",
];

/// `cargo tree` for the package `package` with `args`, one line per entry, without the tree
/// drawing.
fn cargo_tree_of(package: &str, args: &[&str]) -> String {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--locked", "--offline", "--prefix", "none"])
        .args(["--manifest-path", manifest, "-p", package])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("cargo tree prints UTF-8")
}

/// `cargo tree` for the facade with `args`.
fn cargo_tree(args: &[&str]) -> String {
    cargo_tree_of("courier", args)
}

/// The crate names in a `cargo tree --prefix none` listing.
fn names(tree: &str) -> BTreeSet<String> {
    tree.lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The crate names among the normal (non-dev, non-build) dependencies with these features.
fn normal_dependencies(features: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["-e", "normal"];
    args.extend_from_slice(features);
    names(&cargo_tree(&args))
}

/// The tokio features enabled with these facade features.
fn tokio_features(features: &[&str]) -> BTreeSet<String> {
    let mut args = vec!["-e", "normal,features", "-i", "tokio"];
    args.extend_from_slice(features);
    cargo_tree(&args)
        .lines()
        .filter_map(|line| line.strip_prefix("tokio feature \""))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_default_features_give_a_library_without_command_line_dashboard_nor_allocator() {
    let deps = normal_dependencies(&[]);
    for name in ["courier-core", "courier-sql", "courier-runs", "sqlx-sqlite"] {
        assert!(deps.contains(name), "{name} missing from {deps:?}");
    }
    for name in BINARY_ONLY {
        assert!(
            !deps.contains(name),
            "`courier` with its default features pulls {name}"
        );
    }
}

#[test]
fn the_courier_cli_package_has_what_the_library_leaves_out() {
    let deps = names(&cargo_tree_of("courier-cli", &["-e", "normal"]));
    for name in BINARY_ONLY {
        assert!(
            deps.contains(name),
            "{name} missing from courier-cli: {deps:?}"
        );
    }
}

#[test]
fn a_library_user_gets_no_command_line_nor_allocator() {
    for features in [LIBRARY, EVERY_TRANSPORT] {
        let deps = normal_dependencies(&["--no-default-features", "--features", features]);
        assert!(deps.contains("courier-core"), "{deps:?}");
        for name in BINARY_ONLY {
            assert!(
                !deps.contains(name),
                "`courier` with features {features} (no defaults) pulls {name}"
            );
        }
    }
}

#[test]
fn a_library_user_gets_no_signal_process_nor_multi_threaded_tokio() {
    let features = tokio_features(&["--no-default-features", "--features", LIBRARY]);
    assert!(features.contains("rt"), "{features:?}");
    for feature in ["signal", "process", "rt-multi-thread"] {
        assert!(
            !features.contains(feature),
            "`courier` with features {LIBRARY} (no defaults) enables tokio/{feature}: {features:?}"
        );
    }
}

#[test]
fn opentelemetry_comes_only_with_the_otel_feature() {
    let is_otel = |name: &String| name.contains("opentelemetry") || name == "courier-otel";
    for features in [LIBRARY, EVERY_TRANSPORT] {
        let deps = normal_dependencies(&["--no-default-features", "--features", features]);
        let otel: Vec<_> = deps.iter().filter(|n| is_otel(n)).collect();
        assert!(
            otel.is_empty(),
            "`courier` with features {features} pulls {otel:?}"
        );
    }
    let deps = normal_dependencies(&["--no-default-features", "--features", "sql,sqlite,otel"]);
    for name in ["courier-otel", "opentelemetry", "tracing-opentelemetry"] {
        assert!(deps.contains(name), "{name} missing with `otel`: {deps:?}");
    }
    // tracing-subscriber comes with it (tracing-opentelemetry is a layer of its registry).
    for name in ["clap", "mimalloc", "courier-cli"] {
        assert!(!deps.contains(name), "`otel` pulls {name}");
    }
}

#[test]
fn the_run_layer_without_default_features_has_no_sql_store() {
    let is_sql = |name: &String| name.starts_with("sqlx") || name == "courier-sql";
    let deps = names(&cargo_tree_of(
        "courier-runs",
        &["-e", "normal", "--no-default-features"],
    ));
    assert!(deps.contains("courier-core"), "{deps:?}");
    let sql: Vec<_> = deps.iter().filter(|n| is_sql(n)).collect();
    assert!(
        sql.is_empty(),
        "courier-runs without default features pulls {sql:?}"
    );
    // Its default (`sqlite`) brings the SQL store.
    let deps = names(&cargo_tree_of("courier-runs", &["-e", "normal"]));
    for name in ["courier-sql", "sqlx", "sqlx-sqlite"] {
        assert!(
            deps.contains(name),
            "{name} missing from courier-runs: {deps:?}"
        );
    }
}
