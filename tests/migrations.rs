//! Every file under `migrations/` is applied: each `<set>/<dialect>/NNNN_name.sql` is in the
//! list its crate compiled (with the same text), and the setups of the SQL transport, the inbox
//! and the run store on a SQLite file record every SQLite file's version in its set's versions
//! table. A folder that no setup applies fails here, and so does a file outside the layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use courier::runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
use courier::sql::migrate::{self, Migrations};
use courier::sql::{
    DEFAULT_TABLE, Dialect, Inbox, InboxOptions, SqlTransport, schedules_table, workers_table,
};
use courier::{Dsn, MessageRegistry};

/// One file under `migrations/`.
#[derive(Debug)]
struct File {
    path: PathBuf,
    set: String,
    dialect: Dialect,
    version: i64,
    description: String,
    text: String,
}

fn dialect(name: &str) -> Option<Dialect> {
    match name {
        "sqlite" => Some(Dialect::Sqlite),
        "postgres" => Some(Dialect::Postgres),
        "mysql" => Some(Dialect::Mysql),
        _ => None,
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    paths.sort();
    paths
}

/// Every file under `migrations/`; panics on one outside `<set>/<dialect>/NNNN_name.sql`.
fn files() -> Vec<File> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files = Vec::new();
    for set_dir in entries(&root) {
        assert!(
            set_dir.is_dir(),
            "{}: not a set's folder",
            set_dir.display()
        );
        let set = set_dir.file_name().and_then(|n| n.to_str()).expect("UTF-8");
        for dialect_dir in entries(&set_dir) {
            let name = dialect_dir
                .file_name()
                .and_then(|n| n.to_str())
                .expect("UTF-8");
            let dialect = dialect(name)
                .unwrap_or_else(|| panic!("{}: not a dialect's folder", dialect_dir.display()));
            for path in entries(&dialect_dir) {
                let file = path.file_name().and_then(|n| n.to_str()).expect("UTF-8");
                let (number, rest) = file
                    .strip_suffix(".sql")
                    .and_then(|s| s.split_once('_'))
                    .unwrap_or_else(|| panic!("{}: not `NNNN_name.sql`", path.display()));
                files.push(File {
                    set: set.to_owned(),
                    dialect,
                    version: number
                        .parse()
                        .unwrap_or_else(|_| panic!("{}: no version", path.display())),
                    description: rest.replace('_', " "),
                    text: std::fs::read_to_string(&path).expect("read the file"),
                    path,
                });
            }
        }
    }
    assert!(files.len() > 40, "only {} files found", files.len());
    files
}

/// Every set the crates compiled: courier-sql's and the run store's.
fn compiled() -> Vec<&'static Migrations> {
    let mut sets: Vec<&'static Migrations> = migrate::SETS.to_vec();
    sets.push(&courier::runs::MIGRATIONS);
    sets
}

#[test]
fn every_file_under_migrations_is_compiled_into_its_set() {
    let sets = compiled();
    let files = files();
    for file in &files {
        let main = format!("{{{}}}", file.set);
        let set = sets.iter().find(|s| s.main == main).unwrap_or_else(|| {
            panic!(
                "{}: no crate compiles the set `{main}`",
                file.path.display()
            )
        });
        let migration = set
            .list
            .iter()
            .find(|m| m.version == file.version)
            .unwrap_or_else(|| panic!("{}: version not in its set", file.path.display()));
        assert_eq!(
            migration.description,
            file.description,
            "{}",
            file.path.display()
        );
        assert_eq!(
            migration.template(file.dialect),
            Some(file.text.as_str()),
            "{}: compiled text differs",
            file.path.display()
        );
    }
    // And nothing compiled that is not a file.
    let templates: usize = sets
        .iter()
        .flat_map(|s| s.list.iter())
        .map(|m| {
            [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql]
                .into_iter()
                .filter(|d| m.template(*d).is_some())
                .count()
        })
        .sum();
    assert_eq!(templates, files.len());
}

#[tokio::test]
async fn every_sqlite_file_is_recorded_by_the_setups() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("courier.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());

    let transport = SqlTransport::connect(
        "async",
        &Dsn::parse(&url).expect("a DSN"),
        Arc::new(MessageRegistry::new()),
    )
    .await
    .expect("connect the transport");
    transport.migrate().await.expect("set up the transport");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("a pool");
    let inbox_table = "courier_inbox";
    Inbox::new(pool.clone(), InboxOptions::new(inbox_table))
        .await
        .expect("set up the inbox");
    let store = SqlRunStore::connect(&url, SqlRunStoreOptions::default())
        .await
        .expect("connect the run store");
    store.setup().await.expect("set up the run store");

    let options = SqlRunStoreOptions::default();
    let tables: BTreeMap<&str, String> = [
        ("messages", DEFAULT_TABLE.to_owned()),
        ("workers", workers_table(DEFAULT_TABLE)),
        ("dedup", format!("{DEFAULT_TABLE}_dedup")),
        ("schedules", schedules_table(DEFAULT_TABLE)),
        ("inbox", inbox_table.to_owned()),
        ("runs", options.runs_table.clone()),
    ]
    .into_iter()
    .collect();
    let mut checked = 0;
    for file in files().iter().filter(|f| f.dialect == Dialect::Sqlite) {
        let table = tables.get(file.set.as_str()).unwrap_or_else(|| {
            panic!(
                "{}: no setup in this test applies the set `{}`",
                file.path.display(),
                file.set
            )
        });
        let recorded: Vec<i64> =
            sqlx::query_scalar(&format!("SELECT version FROM {table}_migrations"))
                .fetch_all(&pool)
                .await
                .unwrap_or_else(|e| {
                    panic!("{}: read {table}_migrations: {e}", file.path.display())
                });
        assert!(
            recorded.contains(&file.version),
            "{}: not applied ({table}_migrations holds {recorded:?})",
            file.path.display()
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} SQLite files checked");
    pool.close().await;
}
