//! Versioned migrations for tables whose names are configured: the files in `migrations/` are
//! templates (`{messages}`, `{workers}`, `{runs}`, `{events}`), rendered with the table names and applied in
//! order, each once, recorded in a version table of the migrated table's own
//! (`<table>_migrations`), so two sets of tables in one database never share versions and an
//! application's own `_sqlx_migrations` is left alone.
//!
//! A set is a folder, `migrations/<set>/<dialect>/NNNN_name.sql`, found at build time
//! (`build.rs`): versions are unique within a set, which is what its versions table records
//! (the version and the name's description, not the file's path), so the folders could be
//! split by set without renumbering a file that a database has recorded.
//!
//! Every setup holds the dialect's setup lock for the table while it reads and applies versions:
//! a transaction-scoped advisory lock on PostgreSQL (DDL is transactional there, so a failed
//! migration leaves nothing behind), a named `GET_LOCK` on MySQL / MariaDB (DDL commits
//! implicitly, so the session holds the lock), and `BEGIN IMMEDIATE` (the write lock) on SQLite.
//!
//! Tables created before versions were recorded (the 0001-0003 files applied by `.replace()`)
//! are adopted: the version table starts empty, `CREATE ... IF NOT EXISTS` files find their
//! tables, and a file whose change is already there (the `due_at` column of runs' 0003, named
//! by its first line `-- present-when: {runs}.due_at`) is recorded without being run.

use sqlx::{Connection as _, Pool};

use crate::{Dialect, SqlDatabase};

/// One migration: its version, what it does, and its template per dialect. Built by the
/// `build.rs` of the crate that owns the set, from the files of its folder under `migrations/`.
#[derive(Debug)]
pub struct Migration {
    /// The version (the number of its file).
    pub version: i64,
    /// What it does (the rest of its file name).
    pub description: &'static str,
    sqlite: Option<&'static str>,
    postgres: Option<&'static str>,
    mysql: Option<&'static str>,
    /// When this column exists already, the migration is recorded without being run (tables
    /// upgraded before versions were recorded): `(table placeholder, column)`.
    present_when: Option<(&'static str, &'static str)>,
}

impl Migration {
    /// A migration with no template on any dialect yet (recorded, nothing run).
    #[must_use]
    pub const fn new(version: i64, description: &'static str) -> Self {
        Self {
            version,
            description,
            sqlite: None,
            postgres: None,
            mysql: None,
            present_when: None,
        }
    }

    /// With its SQLite template.
    #[must_use]
    pub const fn sqlite(mut self, template: &'static str) -> Self {
        self.sqlite = Some(template);
        self
    }

    /// With its PostgreSQL template.
    #[must_use]
    pub const fn postgres(mut self, template: &'static str) -> Self {
        self.postgres = Some(template);
        self
    }

    /// With its MySQL / MariaDB template.
    #[must_use]
    pub const fn mysql(mut self, template: &'static str) -> Self {
        self.mysql = Some(template);
        self
    }

    /// Recorded without being run when `column` of `table` (a placeholder) exists already.
    #[must_use]
    pub const fn present_when(mut self, table: &'static str, column: &'static str) -> Self {
        self.present_when = Some((table, column));
        self
    }

    /// The template for `dialect` (`None`: nothing to do on that dialect).
    #[must_use]
    pub fn template(&self, dialect: Dialect) -> Option<&'static str> {
        match dialect {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres => self.postgres,
            Dialect::Mysql => self.mysql,
        }
    }
}

/// The migrations of one set of tables, in order: the files of one folder
/// `migrations/<set>/<dialect>/`, recorded in one versions table.
#[derive(Debug)]
pub struct Migrations {
    /// The placeholder of the table whose `<table>_migrations` records the versions.
    pub main: &'static str,
    /// The migrations, oldest first.
    pub list: &'static [Migration],
}

/// The lists `build.rs` writes from `migrations/<set>/`.
mod found {
    use super::Migration;

    include!(concat!(env!("OUT_DIR"), "/migrations.rs"));
}

/// The message table's migrations (placeholder `{messages}`, folder `migrations/messages/`).
pub static MESSAGES: Migrations = Migrations {
    main: "{messages}",
    list: found::MESSAGES,
};

/// The worker registry's migrations (placeholder `{workers}`, folder `migrations/workers/`),
/// beside each message table.
pub static WORKERS: Migrations = Migrations {
    main: "{workers}",
    list: found::WORKERS,
};

/// The deduplication table's migrations (placeholder `{dedup}`: the message table's name with
/// `_dedup` appended; folder `migrations/dedup/`), applied with the message table's.
pub static DEDUP: Migrations = Migrations {
    main: "{dedup}",
    list: found::DEDUP,
};

/// An inbox table's migrations (placeholder `{inbox}`, see [`Inbox`](crate::Inbox); folder
/// `migrations/inbox/`).
pub static INBOX: Migrations = Migrations {
    main: "{inbox}",
    list: found::INBOX,
};

/// The schedule store's, paused queues' and rate-limit buckets' migrations (placeholders
/// `{schedules}`, `{paused}`, `{limits}`; folder `migrations/schedules/`), beside each message
/// table.
pub static SCHEDULES: Migrations = Migrations {
    main: "{schedules}",
    list: found::SCHEDULES,
};

/// Every set of this crate, for a check that each folder under `migrations/` is applied.
pub static SETS: [&Migrations; 5] = [&MESSAGES, &WORKERS, &DEDUP, &INBOX, &SCHEDULES];

/// A migration a setup recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Its version.
    pub version: i64,
    /// What it does.
    pub description: &'static str,
    /// `false` when its change was found already made (a table upgraded before versions were
    /// recorded) and only recorded.
    pub ran: bool,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04} {}", self.version, self.description)?;
        if !self.ran {
            f.write_str(" (found in place)")?;
        }
        Ok(())
    }
}

/// Renders a template with table names: `(placeholder, name)` pairs, names already validated.
#[must_use]
pub fn render(template: &str, tables: &[(&str, &str)]) -> String {
    tables.iter().fold(template.to_owned(), |sql, (key, name)| {
        sql.replace(key, name)
    })
}

/// How long a MySQL setup waits for another process's setup of the same table, in seconds.
const MYSQL_LOCK_WAIT_S: i64 = 60;

/// Applies the migrations of `set` not yet recorded for these tables, under the setup lock;
/// returns what it recorded (empty when the tables are up to date).
///
/// # Errors
/// The database failed, or (MySQL) another setup held the lock for more than a minute.
pub async fn migrate<DB>(
    pool: &Pool<DB>,
    set: &Migrations,
    tables: &[(&str, &str)],
) -> Result<Vec<Applied>, sqlx::Error>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    let main = render(set.main, tables);
    let lock = format!("courier_setup:{main}");
    let mut conn = pool.acquire().await?;
    let locked = match DB::DIALECT {
        Dialect::Mysql => {
            let got: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(GET_LOCK(?, ?), 0) AS SIGNED)")
                .bind(lock.as_str())
                .bind(MYSQL_LOCK_WAIT_S)
                .fetch_one(&mut *conn)
                .await?;
            if got != 1 {
                return Err(sqlx::Error::Protocol(format!(
                    "another setup of `{main}` held its lock for more than {MYSQL_LOCK_WAIT_S}s"
                )));
            }
            Ok(())
        }
        Dialect::Sqlite => sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map(drop),
        Dialect::Postgres => {
            sqlx::query("BEGIN").execute(&mut *conn).await?;
            // `hashtext` gives the lock key; the lock goes at COMMIT or ROLLBACK.
            sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtext($1))) AS l")
                .bind(lock.as_str())
                .execute(&mut *conn)
                .await
                .map(drop)
        }
    };
    let result = match locked {
        Err(e) => Err(e),
        Ok(()) => {
            let versions = format!("{main}_migrations");
            let record = DB::DIALECT.render(&format!(
                "INSERT INTO {versions} (version, description, applied_at) VALUES (?, ?, {{now}})"
            ));
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {versions} (version BIGINT NOT NULL PRIMARY KEY, \
                 description VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL)"
            );
            let read = format!("SELECT version FROM {versions}");
            async {
                sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(&create)).await?;
                let recorded: Vec<i64> = sqlx::query_scalar(&read).fetch_all(&mut *conn).await?;
                let mut applied = Vec::new();
                for migration in set.list {
                    if recorded.contains(&migration.version) {
                        continue;
                    }
                    let present = match migration.present_when {
                        Some((table, column)) => {
                            let probe = has_column(DB::DIALECT, &render(table, tables), column);
                            sqlx::query_scalar::<_, i64>(&probe)
                                .fetch_one(&mut *conn)
                                .await?
                                > 0
                        }
                        None => false,
                    };
                    let template = migration.template(DB::DIALECT);
                    if let (Some(template), false) = (template, present) {
                        let sql = render(template, tables);
                        sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(&sql)).await?;
                    }
                    sqlx::query(&record)
                        .bind(migration.version)
                        .bind(migration.description)
                        .execute(&mut *conn)
                        .await?;
                    applied.push(Applied {
                        version: migration.version,
                        description: migration.description,
                        ran: template.is_some() && !present,
                    });
                }
                Ok(applied)
            }
            .await
        }
    };
    let finish = match (DB::DIALECT, result.is_ok()) {
        (Dialect::Mysql, _) => "SELECT RELEASE_LOCK(?)",
        (_, true) => "COMMIT",
        (_, false) => "ROLLBACK",
    };
    let mut q = sqlx::query(finish);
    if DB::DIALECT == Dialect::Mysql {
        q = q.bind(lock.as_str());
    }
    match q.execute(&mut *conn).await {
        Ok(_) => result,
        Err(e) => {
            // A connection left inside a transaction or holding the lock must not go back to
            // the pool.
            let _ = conn.detach().close().await;
            result.and(Err(e))
        }
    }
}

/// A migration of `set` not recorded in `<table>_migrations`, for a schema that Courier only
/// checks (`auto_setup = false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The table that records the versions (`<table>_migrations`).
    pub versions_table: String,
    /// The version not recorded.
    pub version: i64,
    /// What it does.
    pub description: &'static str,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "migration {:04} {} is not recorded in `{}`",
            self.version, self.description, self.versions_table
        )
    }
}

/// The migrations of `set` not recorded for these tables, oldest first (every one when the
/// versions table does not exist): what a schema set up by the application's own migration
/// tool lacks. Changes nothing.
///
/// # Errors
/// The database failed (other than a missing versions table).
pub async fn missing<DB>(
    pool: &Pool<DB>,
    set: &Migrations,
    tables: &[(&str, &str)],
) -> Result<Vec<Missing>, sqlx::Error>
where
    DB: SqlDatabase,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
{
    let versions_table = format!("{}_migrations", render(set.main, tables));
    let read = format!("SELECT version FROM {versions_table}");
    let mut conn = pool.acquire().await?;
    let recorded: Vec<i64> = match sqlx::query_as::<_, (i64,)>(&read)
        .fetch_all(&mut *conn)
        .await
    {
        Ok(rows) => rows.into_iter().map(|(v,)| v).collect(),
        // No versions table: nothing was ever set up.
        Err(sqlx::Error::Database(_)) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(set
        .list
        .iter()
        .filter(|m| !recorded.contains(&m.version))
        .map(|m| Missing {
            versions_table: versions_table.clone(),
            version: m.version,
            description: m.description,
        })
        .collect())
}

/// The SQL that sets up `set` from nothing on `dialect`, as [`migrate`] would run it: the
/// versions table, then each migration rendered with the table names followed by the insert
/// of its version row (`applied_at` from the database clock). Plain SQL statements ending in
/// `;`, no placeholder left, for the application's own migration tool.
#[must_use]
pub fn script(dialect: Dialect, set: &Migrations, tables: &[(&str, &str)]) -> String {
    let main = render(set.main, tables);
    let versions = format!("{main}_migrations");
    let mut out = format!(
        "CREATE TABLE IF NOT EXISTS {versions} (version BIGINT NOT NULL PRIMARY KEY, \
         description VARCHAR(255) NOT NULL, applied_at BIGINT NOT NULL);\n"
    );
    let now = dialect.render("{now}");
    for migration in set.list {
        out.push_str(&format!(
            "\n-- {:04} {}\n",
            migration.version, migration.description
        ));
        if let Some(template) = migration.template(dialect) {
            let sql = render(template, tables);
            let sql = sql.trim_end();
            out.push_str(sql);
            if !sql.ends_with(';') {
                out.push(';');
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "INSERT INTO {versions} (version, description, applied_at) VALUES ({}, '{}', {now});\n",
            migration.version,
            migration.description.replace('\'', "''")
        ));
    }
    out
}

/// The SQL that sets up a message table `table` (validated by the caller) and the tables
/// beside it on `dialect`, in the order [`SqlTransport::migrate`](crate::SqlTransport::migrate)
/// applies them: the messages table, the worker registry, the schedules, paused queues and
/// rate-limit buckets, the deduplication keys; each set followed by its version rows (see
/// [`script`]).
#[must_use]
pub fn transport_script(dialect: Dialect, table: &str) -> String {
    let workers = crate::workers::workers_table(table);
    let schedules = crate::schedules::schedules_table(table);
    let paused = crate::paused::paused_table(table);
    let limits = crate::limits::limits_table(table);
    let dedup = crate::dedup::dedup_table(table);
    [
        script(dialect, &MESSAGES, &[("{messages}", table)]),
        script(dialect, &WORKERS, &[("{workers}", &workers)]),
        script(
            dialect,
            &SCHEDULES,
            &[
                ("{schedules}", &schedules),
                ("{paused}", &paused),
                ("{limits}", &limits),
            ],
        ),
        script(dialect, &DEDUP, &[("{dedup}", &dedup)]),
    ]
    .join("\n")
}

/// The count of `column` in `table` (both validated identifiers), as SQL.
fn has_column(dialect: Dialect, table: &str, column: &str) -> String {
    match dialect {
        Dialect::Sqlite => {
            format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = '{column}'")
        }
        Dialect::Postgres => format!(
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() \
             AND table_name = lower('{table}') AND column_name = '{column}'"
        ),
        Dialect::Mysql => format!(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = '{table}' AND column_name = '{column}'"
        ),
    }
}
