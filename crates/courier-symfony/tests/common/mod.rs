//! The interop tests' shared parts: the Rust twins of the PHP app's messages
//! (`tests/symfony/messages.php`), the PHP child processes and the databases.

#![allow(dead_code, reason = "each test file uses part of it")]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, FixedOffset};
use courier_core::{Message, MessageRegistry};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use courier_symfony::{DoctrineOptions, DoctrineTransport};
use courier_symfony::{SymfonySerializer, SymfonyTypes};
use serde::{Deserialize, Serialize};

pub(crate) mod scenarios;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Address {
    pub(crate) street: String,
    pub(crate) city: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Priority {
    Low,
    High,
}

/// `App\Message\SendEmail`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SendEmail {
    pub(crate) id: i64,
    pub(crate) to: String,
    pub(crate) subject: String,
    pub(crate) address: Option<Address>,
    #[serde(with = "courier_symfony::php_datetime::option")]
    pub(crate) sent_at: Option<DateTime<FixedOffset>>,
    pub(crate) priority: Priority,
    pub(crate) tags: Vec<String>,
}

impl Message for SendEmail {
    const NAME: &'static str = "mail.send";
}

/// `App\Message\Misfit` as Courier wrongly thinks it is (`id` is a string in PHP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Misfit {
    pub(crate) id: u64,
}

impl Message for Misfit {
    const NAME: &'static str = "mail.misfit";
}

/// What `dispatch.php` sends as message `id`, sent at 2024-05-06 07:08:09 in `offset`.
pub(crate) fn email(id: i64, offset: &str) -> SendEmail {
    SendEmail {
        id,
        to: format!("user{id}@example.com"),
        subject: format!("Subject {id} / Grüße"),
        address: Some(Address {
            street: format!("{id} Main St"),
            city: "Köln".into(),
        }),
        sent_at: DateTime::parse_from_rfc3339(&format!("2024-05-06T07:08:09{offset}")).ok(),
        priority: if id % 2 == 0 {
            Priority::High
        } else {
            Priority::Low
        },
        tags: vec![format!("t{id}")],
    }
}

pub(crate) fn registry() -> Arc<MessageRegistry> {
    Arc::new(MessageRegistry::new().with::<SendEmail>().with::<Misfit>())
}

pub(crate) fn serializer() -> SymfonySerializer {
    SymfonySerializer::new(
        SymfonyTypes::new()
            .map(r"App\Message\SendEmail", "mail.send")
            .map(r"App\Message\Misfit", "mail.misfit"),
    )
}

/// A line `consume.php` printed.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Consumed {
    pub(crate) class: String,
    pub(crate) id: Option<i64>,
    pub(crate) retry: u32,
    pub(crate) subject: Option<String>,
    pub(crate) priority: Option<String>,
    #[serde(rename = "sentAt")]
    pub(crate) sent_at: Option<String>,
}

/// Runs `tests/symfony/<script>` with PHP in `zone`, within `limit`; its stdout. Fails loudly
/// when PHP is missing or the script fails.
pub(crate) async fn php(script: &str, args: &[&str], zone: &str, limit: Duration) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/symfony");
    let php = std::env::var("COURIER_TEST_PHP").unwrap_or_else(|_| "php".to_owned());
    let child = tokio::process::Command::new(&php)
        .arg("-d")
        .arg(format!("date.timezone={zone}"))
        .arg(dir.join(script))
        .args(args)
        .env("TZ", zone)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(limit, child)
        .await
        .unwrap_or_else(|_| panic!("php {script} did not finish within {limit:?}"))
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{php}` ({e}): these tests need PHP with Debian's Symfony Messenger; \
                 run scripts/services as root (it installs them)"
            )
        });
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "php {script} {args:?} failed ({}):\n{}\n{stdout}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The lines `consume.php` printed.
pub(crate) fn consumed(stdout: &str) -> Vec<Consumed> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
/// One database for a test: a SQLite file in a temporary directory, or a table of its own on
/// the shared PostgreSQL or MariaDB (dropped when the test ends).
pub(crate) struct Db {
    /// Courier's URL.
    pub(crate) url: String,
    /// The table.
    pub(crate) table: String,
    /// PHP's DSN without the options.
    php_dsn: String,
    php_options: String,
    _dir: Option<tempfile::TempDir>,
    _cleanup: Option<courier_test::Cleanup>,
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    Mysql,
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl Db {
    pub(crate) fn new(kind: Kind) -> Self {
        match kind {
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let path = dir.path().join("messenger.db");
                Self {
                    url: format!("sqlite://{}", path.display()),
                    table: "messenger_messages".into(),
                    php_dsn: format!("doctrine://sqlite:///{}", path.display()),
                    php_options: String::new(),
                    _dir: Some(dir),
                    _cleanup: None,
                }
            }
            Kind::Postgres => {
                let cleanup = courier_test::Cleanup::new();
                let table = cleanup.postgres_table("symfony");
                let url = courier_test::env::postgres_url();
                Self {
                    php_dsn: format!("doctrine://{url}"),
                    // PHP's PostgreSQL connection waits for a NOTIFY, and looks for delayed
                    // messages only this often (a minute by default).
                    php_options: "&check_delayed_interval=500".into(),
                    url,
                    table,
                    _dir: None,
                    _cleanup: Some(cleanup),
                }
            }
            Kind::Mysql => {
                let cleanup = courier_test::Cleanup::new();
                let table = cleanup.mysql_table("symfony");
                let url = courier_test::env::mysql_url();
                let sep = if url.contains('?') { '&' } else { '?' };
                Self {
                    // DBAL's `mysql://` is pdo_mysql.
                    php_dsn: format!("doctrine://{url}{sep}charset=utf8mb4"),
                    php_options: String::new(),
                    url,
                    table,
                    _dir: None,
                    _cleanup: Some(cleanup),
                }
            }
        }
    }

    /// PHP's DSN for `queue`.
    pub(crate) fn php(&self, queue: &str) -> String {
        format!(
            "{}#table_name={}&queue_name={queue}{}",
            self.php_dsn, self.table, self.php_options
        )
    }

    /// Courier's transport on `queue`, datetimes in `zone`.
    pub(crate) async fn courier(&self, queue: &str, zone: chrono_tz::Tz) -> Arc<DoctrineTransport> {
        let options = DoctrineOptions::default()
            .table_name(self.table.clone())
            .queue_name(queue)
            .zone(zone);
        Arc::new(
            tokio::time::timeout(
                Duration::from_secs(20),
                DoctrineTransport::connect(queue, &self.url, options, serializer(), registry()),
            )
            .await
            .expect("connect in time")
            .expect("connects"),
        )
    }
}

/// The ids in `range`, as a set.
pub(crate) fn ids(range: std::ops::RangeInclusive<i64>) -> BTreeSet<i64> {
    range.collect()
}
