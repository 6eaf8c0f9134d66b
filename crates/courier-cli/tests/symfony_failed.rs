//! `courier failed show` and `failed retry` on a Symfony failure transport: a real Symfony
//! Messenger 5.4 worker (PHP, `tests/symfony/`) fails messages for good into the `failed` queue
//! of its Doctrine table (SQLite); the `courier` binary, configured with a `symfony+sqlite://`
//! DSN and a `sqlite://` one with `serializer = "symfony"`, and `[symfony.types]`, shows them with their type, origin and error, and retries one
//! back to the PHP queue, where PHP consumes it.
//!
//! Run with `--include-ignored` after `scripts/services php` (COURIER_TEST_PHP names php).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn php(script: &str, args: &[&str]) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/symfony");
    let php = std::env::var("COURIER_TEST_PHP").unwrap_or_else(|_| "php".to_owned());
    let out = Command::new(&php)
        .arg("-d")
        .arg("date.timezone=UTC")
        .arg(dir.join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{php}` ({e}): run scripts/services php"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "php {script}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn courier(config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("the courier binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "courier {args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
#[ignore = "needs php: run scripts/services php"]
fn courier_failed_shows_and_retries_what_symfony_failed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("messenger.db");
    let php_dsn = |queue: &str| {
        format!(
            "doctrine://sqlite:///{}#table_name=messenger_messages&queue_name={queue}",
            db.display()
        )
    };
    let config = dir.path().join("courier.toml");
    std::fs::write(
        &config,
        format!(
            "[transports.async]\ndsn = \"symfony+sqlite://{db}?queue_name=default\"\n\
             failure_transport = \"failed\"\n\
             [transports.failed]\ndsn = \"sqlite://{db}\"\nserializer = \"symfony\"\n\
             options = {{ queue_name = \"failed\" }}\n\
             [symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n",
            db = db.display()
        ),
    )
    .unwrap();
    php("dispatch.php", &[&php_dsn("default"), "1", "2"]);
    php(
        "fail.php",
        &[&php_dsn("default"), &php_dsn("failed"), "2", "30"],
    );

    let shown: serde_json::Value =
        serde_json::from_str(&courier(&config, &["failed", "show", "--format", "json"])).unwrap();
    let shown = shown.as_array().expect("a list");
    assert_eq!(shown.len(), 2, "{shown:?}");
    for (n, failed) in (1..).zip(shown) {
        assert_eq!(failed["type"], "mail.send", "{failed}");
        assert_eq!(failed["transport"], "async", "{failed}");
        assert_eq!(failed["error_class"], "RuntimeException", "{failed}");
        assert_eq!(
            failed["error"],
            format!("failed in PHP for good: {n}"),
            "{failed}"
        );
    }

    let id = shown[0]["id"].as_str().unwrap().to_owned();
    courier(&config, &["failed", "retry", "--force", &id]);
    let left: serde_json::Value =
        serde_json::from_str(&courier(&config, &["failed", "show", "--format", "json"])).unwrap();
    assert_eq!(left.as_array().map(Vec::len), Some(1), "{left}");

    let consumed = php("consume.php", &[&php_dsn("default"), "1", "20"]);
    let lines: Vec<serde_json::Value> = consumed
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{consumed}");
    assert_eq!(lines[0]["class"], r"App\Message\SendEmail");
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["retry"], 0);
}
