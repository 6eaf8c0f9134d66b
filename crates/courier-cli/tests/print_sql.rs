//! `courier setup --print-sql` round trip: the printed SQL, applied by the database's own
//! command-line client (`sqlite3`, `psql`, `mariadb`) to an empty database or schema of its
//! own, is the whole schema: a worker with `auto_setup=false` handles a message on it. Before
//! the SQL is applied, the worker creates nothing and names the first missing migration.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::process::{Command, Stdio};

use common::Env;

/// The database of one round trip, and how its own client runs a script on it.
trait Database {
    /// The DSN a Courier configuration names it by (its own database or schema).
    fn dsn(&self) -> String;
    /// Runs `sql` with the command-line client, stopping at the first error.
    fn apply(&self, env: &Env, sql: &str);
    /// Whether `table` exists.
    fn has_table(&self, env: &Env, table: &str) -> bool;
}

/// Runs `program` with `args`, `stdin` piped in; asserts success and returns stdout.
fn client(program: &str, args: &[&str], envs: &[(&str, &str)], stdin: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Sqlite;

impl Database for Sqlite {
    fn dsn(&self) -> String {
        "sqlite://app.db".to_owned()
    }
    fn apply(&self, env: &Env, sql: &str) {
        let db = env.path("app.db");
        client("sqlite3", &["-bail", db.to_str().unwrap()], &[], sql);
    }
    fn has_table(&self, env: &Env, table: &str) -> bool {
        let db = env.path("app.db");
        let q = format!(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}';"
        );
        client("sqlite3", &[db.to_str().unwrap()], &[], &q).trim() == "1"
    }
}

/// A schema of its own on the test server, dropped with everything in it.
struct Postgres {
    url: String,
    schema: String,
}

impl Postgres {
    fn new() -> Self {
        let db = Self {
            url: courier_test::env::postgres_url(),
            schema: courier_test::env::unique_name("printsql"),
        };
        db.psql(&format!("CREATE SCHEMA {};", db.schema), false);
        db
    }
    fn psql(&self, sql: &str, in_schema: bool) -> String {
        let options = format!("-c search_path={}", self.schema);
        let envs: &[(&str, &str)] = if in_schema {
            &[("PGOPTIONS", options.as_str())]
        } else {
            &[]
        };
        client(
            "psql",
            &[&self.url, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"],
            envs,
            sql,
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &self.url,
                "-X",
                "-q",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Database for Postgres {
    fn dsn(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.url, self.schema
        )
    }
    fn apply(&self, _: &Env, sql: &str) {
        self.psql(sql, true);
    }
    fn has_table(&self, _: &Env, table: &str) -> bool {
        let q = format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = '{table}';",
            self.schema
        );
        self.psql(&q, false).trim() == "1"
    }
}

/// A database of its own on the test server, dropped with everything in it.
struct Mariadb {
    url: courier_core::Dsn,
    database: String,
}

impl Mariadb {
    fn new() -> Self {
        let db = Self {
            url: courier_core::Dsn::parse(&courier_test::env::mysql_url()).unwrap(),
            database: courier_test::env::unique_name("printsql"),
        };
        db.mariadb(None, &format!("CREATE DATABASE {};", db.database));
        db
    }
    fn mariadb(&self, database: Option<&str>, sql: &str) -> String {
        let host = format!("--host={}", self.url.host().unwrap_or("127.0.0.1"));
        let port = format!("--port={}", self.url.port().unwrap_or(3306));
        let user = format!("--user={}", self.url.user().unwrap_or("root"));
        let mut args = vec![host, port, user, "--batch".to_owned(), "-N".to_owned()];
        if let Some(d) = database {
            args.push(d.to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let password = self.url.password().unwrap_or_default().to_owned();
        client("mariadb", &args, &[("MYSQL_PWD", &password)], sql)
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {};", self.database);
        let _ = std::panic::catch_unwind(|| self.mariadb(None, &sql));
    }
}

impl Database for Mariadb {
    fn dsn(&self) -> String {
        let base = self.url.expose_without_query();
        let server = &base[..base.rfind('/').unwrap()];
        format!("{server}/{}", self.database)
    }
    fn apply(&self, _: &Env, sql: &str) {
        self.mariadb(Some(&self.database), sql);
    }
    fn has_table(&self, _: &Env, table: &str) -> bool {
        let q = format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = '{table}';",
            self.database
        );
        self.mariadb(None, &q).trim() == "1"
    }
}

fn round_trip(db: &dyn Database) {
    let env = Env::empty();
    let table = "rt_messages";
    let dsn = db.dsn();
    let sep = if dsn.contains('?') { '&' } else { '?' };
    let transport =
        format!("[transports.async]\ndsn = \"{dsn}{sep}table_name={table}&auto_setup=false\"\n");
    // The transport alone first: a worker on the empty database creates nothing, and stops at
    // startup (exit 2, not at its first message) naming the missing migration.
    env.write("bare.toml", &transport);
    let bare = env.run(&["--config", "bare.toml", "consume", "--time-limit", "30s"]);
    let error = bare.fails(2);
    assert!(
        error.contains(
            "migration 0001 courier messages is not recorded in `rt_messages_migrations`"
        ) && error.contains("auto_setup is off")
            && error.contains("courier setup --print-sql"),
        "{error}"
    );
    assert!(
        !db.has_table(&env, table),
        "auto_setup=false created the table"
    );

    env.write(
        "courier.toml",
        &format!(
            "{transport}\n[routing]\n\"courier.run_agent\" = \"async\"\n\n[runs]\nstore = \"{dsn}\"\nauto_setup = false\nbackoff = {{ base = \"50ms\", cap = \"200ms\" }}\n"
        ),
    );
    // The run store with `runs.auto_setup = false`: checked, never created.
    let refused = env.run(&[
        "--config",
        "courier.toml",
        "runs",
        "submit",
        "scripted",
        "--input",
        "{}",
    ]);
    let error = refused.fails(2);
    assert!(
        error.contains("is not recorded in `courier_runs_migrations`")
            && error.contains("runs.auto_setup is off"),
        "{error}"
    );
    assert!(
        !db.has_table(&env, "courier_runs"),
        "runs.auto_setup=false created the runs table"
    );
    let sql = env
        .run(&["--config", "courier.toml", "setup", "--print-sql"])
        .ok()
        .to_owned();
    for placeholder in [
        "{messages}",
        "{workers}",
        "{schedules}",
        "{paused}",
        "{limits}",
        "{dedup}",
        "{runs}",
        "{events}",
        "{now}",
    ] {
        assert!(!sql.contains(placeholder), "{placeholder} left in:\n{sql}");
    }
    for t in [
        "rt_messages",
        "rt_messages_migrations",
        "rt_workers",
        "rt_schedules",
        "rt_paused",
        "rt_limits",
        "rt_messages_dedup",
        "courier_runs",
        "courier_run_events",
        "courier_runs_migrations",
    ] {
        assert!(
            sql.contains(&format!("CREATE TABLE IF NOT EXISTS {t} ")),
            "no {t} in:\n{sql}"
        );
    }
    db.apply(&env, &sql);
    assert!(db.has_table(&env, table));

    let id = env
        .run(&[
            "--config",
            "courier.toml",
            "runs",
            "submit",
            "scripted",
            "--input",
            r#"{"steps": [{"output": "done"}]}"#,
            "--format",
            "json",
        ])
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let consumed = env.run(&[
        "--config",
        "courier.toml",
        "consume",
        "--limit",
        "1",
        "--time-limit",
        "30s",
    ]);
    consumed.ok();
    assert!(
        consumed.stderr.contains("1 handled") || consumed.stdout.contains("1 handled"),
        "{consumed:?}"
    );
    assert!(
        !consumed.stderr.contains("WARN"),
        "the schema is complete: {}",
        consumed.stderr
    );
    let run = env
        .run(&[
            "--config",
            "courier.toml",
            "runs",
            "show",
            &id,
            "--format",
            "json",
        ])
        .json();
    assert_eq!(run["status"], "completed", "{run}");
}

#[test]
fn print_sql_applied_by_sqlite3_is_the_whole_schema() {
    round_trip(&Sqlite);
}

#[test]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
fn print_sql_applied_by_psql_is_the_whole_schema() {
    round_trip(&Postgres::new());
}

#[test]
#[ignore = "needs mariadb: set COURIER_TEST_MYSQL_URL"]
fn print_sql_applied_by_mariadb_is_the_whole_schema() {
    round_trip(&Mariadb::new());
}

#[test]
fn print_sql_takes_a_dialect_and_a_table_and_refuses_bad_ones() {
    let env = Env::empty();
    env.write("courier.toml", "[transports.mem]\ndsn = \"in-memory://\"\n");
    let sql = env
        .run(&[
            "--config",
            "courier.toml",
            "setup",
            "--print-sql",
            "--dialect",
            "mysql",
            "--table",
            "jobs",
        ])
        .ok()
        .to_owned();
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS jobs "), "{sql}");
    assert!(
        sql.contains("INSERT INTO jobs_migrations (version, description, applied_at) VALUES (1, 'courier messages', CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED));"),
        "{sql}"
    );
    let bad = env.run(&[
        "--config",
        "courier.toml",
        "setup",
        "--print-sql",
        "--dialect",
        "oracle",
    ]);
    assert!(bad.fails(2).contains("unknown database `oracle`"));
    let bad = env.run(&[
        "--config",
        "courier.toml",
        "setup",
        "--print-sql",
        "--dialect",
        "sqlite",
        "--table",
        "x;drop",
    ]);
    assert!(bad.fails(2).contains("--table"));

    // A pool handed over in code: its database is named on the command line.
    env.write(
        "pool.toml",
        "[transports.app]\ndsn = \"pool://main?table_name=app_jobs\"\n",
    );
    let bad = env.run(&["--config", "pool.toml", "setup", "--print-sql"]);
    assert!(
        bad.fails(2)
            .contains("transport `app` runs on a pool handed over in code")
    );
    let sql = env
        .run(&[
            "--config",
            "pool.toml",
            "setup",
            "--print-sql",
            "--dialect",
            "postgres",
        ])
        .ok()
        .to_owned();
    assert!(
        sql.contains("CREATE TABLE IF NOT EXISTS app_jobs "),
        "{sql}"
    );
    assert!(sql.contains("BIGSERIAL"), "{sql}");
}
