//! A conformance [`Harness`] for the SQL transport on any dialect: one unique table per
//! transport, deliveries expired by rewriting `delivered_at`, connections killed from a separate
//! admin connection, tables dropped (side tables included) when the harness goes, pass or fail.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{Dsn, Encoded, Transport, async_trait};
use courier_sql::SqlTransport;
use courier_test::{Harness, Poison};

/// The admin connection a harness uses for what the transport must not do itself.
pub(crate) enum Admin {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

impl Admin {
    /// The PostgreSQL pool of a PostgreSQL harness.
    #[cfg(feature = "postgres")]
    #[allow(dead_code, reason = "not every test file uses it")]
    pub(crate) fn postgres(&self) -> &sqlx::PgPool {
        match self {
            Self::Postgres(pool) => pool,
            #[allow(unreachable_patterns, reason = "one database per feature set")]
            _ => panic!("not a PostgreSQL harness"),
        }
    }

    /// Epoch ms from the database clock, as SQL.
    pub(crate) fn now(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => {
                "(CAST(strftime('%s','now') AS INTEGER) * 1000 + CAST(substr(strftime('%f','now'), 4) AS INTEGER))"
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT",
            #[cfg(feature = "mysql")]
            Self::MySql(_) => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
        }
    }

    /// Runs one statement with string binds (`?` placeholders are rewritten to `$n` on
    /// PostgreSQL); returns rows affected.
    pub(crate) async fn exec(&self, sql: &str, binds: &[&str]) -> u64 {
        let run = async {
            match self {
                #[cfg(feature = "sqlite")]
                Self::Sqlite(p) => {
                    let mut q = sqlx::query(sql);
                    for b in binds {
                        q = q.bind(*b);
                    }
                    q.execute(p).await.map(|r| r.rows_affected())
                }
                #[cfg(feature = "postgres")]
                Self::Postgres(p) => {
                    let mut n = 0;
                    let sql: String = sql
                        .chars()
                        .map(|c| {
                            if c == '?' {
                                n += 1;
                                format!("${n}")
                            } else {
                                c.to_string()
                            }
                        })
                        .collect();
                    let mut q = sqlx::query(&sql);
                    for b in binds {
                        q = q.bind(*b);
                    }
                    q.execute(p).await.map(|r| r.rows_affected())
                }
                #[cfg(feature = "mysql")]
                Self::MySql(p) => {
                    let mut q = sqlx::query(sql);
                    for b in binds {
                        q = q.bind(*b);
                    }
                    q.execute(p).await.map(|r| r.rows_affected())
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| panic!("admin statement timed out: {sql}"))
            .unwrap_or_else(|e| panic!("admin statement failed: {sql}: {e}"))
    }

    /// Counts the rows of a table.
    pub(crate) async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let run = async {
            match self {
                #[cfg(feature = "sqlite")]
                Self::Sqlite(p) => sqlx::query_scalar::<_, i64>(&sql).fetch_one(p).await,
                #[cfg(feature = "postgres")]
                Self::Postgres(p) => sqlx::query_scalar::<_, i64>(&sql).fetch_one(p).await,
                #[cfg(feature = "mysql")]
                Self::MySql(p) => sqlx::query_scalar::<_, i64>(&sql).fetch_one(p).await,
            }
        };
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .unwrap_or_else(|_| panic!("count timed out"))
            .unwrap_or_else(|e| panic!("count failed: {e}"))
    }
}

/// The harness: a base DSN (no query), extra DSN options, the admin pool, and the transports
/// it made.
pub(crate) struct SqlHarness {
    pub(crate) base: String,
    pub(crate) extra: String,
    pub(crate) admin: Admin,
    pub(crate) app: String,
    pub(crate) made: Mutex<Vec<(Arc<SqlTransport>, String)>>,
    pub(crate) dir: Option<tempfile::TempDir>,
    /// Drops every table of the transports made (with their side tables) when the harness
    /// goes, after the transports (fields drop in order).
    pub(crate) cleanup: courier_test::Cleanup,
}

impl SqlHarness {
    /// A unique table name `prefix_<random>`, dropped with every table beside it
    /// (`prefix_<random>_...`) when the harness goes, pass or fail.
    pub(crate) fn table(&self, prefix: &str) -> String {
        let table = courier_test::env::unique_name(prefix);
        if self.dir.is_none() {
            self.cleanup.sql_tables(&self.base, &table);
        }
        table
    }

    /// A transport on a fresh table with extra DSN options (`&k=v...`).
    pub(crate) async fn make(&self, options: &str) -> (Arc<SqlTransport>, String) {
        let table = self.table("courier_t");
        let dsn = format!(
            "{}?table_name={table}&poll_window=200ms{}{options}",
            self.base, self.extra
        );
        let dsn = Dsn::parse(&dsn).unwrap_or_else(|e| panic!("{e}"));
        let t = tokio::time::timeout(
            Duration::from_secs(30),
            SqlTransport::connect("test", &dsn, courier_test::registry()),
        )
        .await
        .unwrap_or_else(|_| panic!("connecting timed out"))
        .unwrap_or_else(|e| panic!("connecting failed: {e}"));
        let t = Arc::new(t);
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((t.clone(), table.clone()));
        (t, table)
    }

    /// Another transport (own pool) on an existing table.
    pub(crate) async fn reuse(&self, table: &str) -> Arc<SqlTransport> {
        self.reuse_with(table, "").await
    }

    /// Another transport on an existing table, with extra DSN options (`&k=v...`).
    pub(crate) async fn reuse_with(&self, table: &str, options: &str) -> Arc<SqlTransport> {
        let dsn = format!(
            "{}?table_name={table}&poll_window=200ms{}{options}",
            self.base, self.extra
        );
        let dsn = Dsn::parse(&dsn).unwrap_or_else(|e| panic!("{e}"));
        let t = tokio::time::timeout(
            Duration::from_secs(30),
            SqlTransport::connect("test", &dsn, courier_test::registry()),
        )
        .await
        .unwrap_or_else(|_| panic!("connecting timed out"))
        .unwrap_or_else(|e| panic!("connecting failed: {e}"));
        Arc::new(t)
    }

    fn find(&self, transport: &Arc<dyn Transport>) -> (Arc<SqlTransport>, String) {
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let wanted = Arc::as_ptr(transport).cast::<u8>();
        made.iter()
            .find(|(t, _)| Arc::as_ptr(t).cast::<u8>() == wanted)
            .cloned()
            .unwrap_or_else(|| panic!("transport not made by this harness"))
    }

    /// Makes every live delivery of `table` claimable again.
    pub(crate) async fn expire_table(&self, table: &str) {
        let sql = format!(
            "UPDATE {table} SET delivered_at = delivered_at - 864000000 WHERE delivered_at IS NOT NULL"
        );
        self.admin.exec(&sql, &[]).await;
    }
}

#[async_trait]
impl Harness for SqlHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        self.make("").await.0
    }

    async fn transport_with_redelivery(&self, window: Duration) -> Option<Arc<dyn Transport>> {
        let options = format!("&redeliver_timeout={}ms", window.as_millis());
        Some(self.make(&options).await.0)
    }

    async fn expire_deliveries(&self, transport: &Arc<dyn Transport>) {
        let (_, table) = self.find(transport);
        self.expire_table(&table).await;
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        let (t, table) = self.find(transport);
        let now = self.admin.now();
        let sql = format!(
            "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
             VALUES (?, ?, ?, 0, {now}, {now})"
        );
        let headers = encoded.headers_json();
        self.admin
            .exec(&sql, &[t.options().queue(), &encoded.body, &headers])
            .await;
    }

    async fn store_poison(&self, transport: &Arc<dyn Transport>, poison: Poison) -> bool {
        let (t, table) = self.find(transport);
        let now = self.admin.now();
        // Body and headers as SQL: a bound value (`?`) or a literal.
        let (body, headers): (&str, &str) = match (&self.admin, poison) {
            (_, Poison::HeadersNotJson) => ("?", "'not json'"),
            #[cfg(feature = "sqlite")]
            (Admin::Sqlite(_), Poison::BinaryBody) => ("?", "?"),
            #[cfg(feature = "sqlite")]
            (Admin::Sqlite(_), Poison::BodyOfAnotherType) => ("42", "?"),
            #[cfg(feature = "sqlite")]
            (Admin::Sqlite(_), Poison::BinaryHeaders) => ("?", "X'7b22ff22'"),
            // NOT NULL columns; PostgreSQL and MariaDB keep text columns valid UTF-8.
            _ => return false,
        };
        let sql = format!(
            "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at) \
             VALUES (?, {body}, {headers}, 0, {now}, {now})"
        );
        let good_body = r#"{"seq":2,"text":"x"}"#;
        match &self.admin {
            #[cfg(feature = "sqlite")]
            Admin::Sqlite(p) => {
                let mut q = sqlx::query(&sql).bind(t.options().queue().to_owned());
                if body == "?" {
                    q = if poison == Poison::BinaryBody {
                        q.bind(courier_test::POISON_BODY.to_vec())
                    } else {
                        q.bind(good_body)
                    };
                }
                if headers == "?" {
                    q = q.bind(courier_test::POISON_HEADERS);
                }
                q.execute(p)
                    .await
                    .unwrap_or_else(|e| panic!("storing {poison:?}: {e}"));
            }
            _ => {
                self.admin
                    .exec(&sql, &[t.options().queue(), good_body])
                    .await;
            }
        }
        true
    }

    async fn break_connection(&self, transport: &Arc<dyn Transport>) -> bool {
        let (t, _) = self.find(transport);
        let _ = &t;
        match &self.admin {
            #[cfg(feature = "sqlite")]
            Admin::Sqlite(_) => false,
            #[cfg(feature = "postgres")]
            Admin::Postgres(_) => {
                let killed = self
                    .admin
                    .exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ?", &[&self.app])
                    .await;
                assert!(killed > 0, "no connection of the transport found to kill");
                true
            }
            #[cfg(feature = "mysql")]
            Admin::MySql(p) => {
                let ids = t.server_connection_ids();
                assert!(
                    !ids.is_empty(),
                    "no connection of the transport found to kill"
                );
                for id in ids {
                    // A connection already closed is fine.
                    let _ = sqlx::query(&format!("KILL {id}")).execute(p).await;
                }
                true
            }
        }
    }

    fn poll_window(&self) -> Duration {
        Duration::from_millis(200)
    }
}

/// A harness on a SQLite file in a fresh temp dir.
#[cfg(feature = "sqlite")]
pub(crate) async fn sqlite() -> SqlHarness {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("courier.db");
    let base = format!("sqlite://{}", path.display());
    let opts = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(&base)
        .unwrap_or_else(|e| panic!("{e}"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    SqlHarness {
        base,
        extra: String::new(),
        admin: Admin::Sqlite(pool),
        app: String::new(),
        made: Mutex::default(),
        dir: Some(dir),
        cleanup: courier_test::Cleanup::new(),
    }
}

/// A harness on `COURIER_TEST_POSTGRES_URL`.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres() -> SqlHarness {
    let url = courier_test::env::postgres_url();
    let pool = tokio::time::timeout(
        Duration::from_secs(30),
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&url),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to PostgreSQL timed out"))
    .unwrap_or_else(|e| panic!("connecting to PostgreSQL failed: {e}"));
    let app = courier_test::env::unique_name("courier_test");
    let base = Dsn::parse(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .expose_without_query()
        .to_owned();
    SqlHarness {
        base,
        extra: format!("&application_name={app}"),
        admin: Admin::Postgres(pool),
        app,
        made: Mutex::default(),
        dir: None,
        cleanup: courier_test::Cleanup::new(),
    }
}

/// A harness on `COURIER_TEST_MYSQL_URL`.
#[cfg(feature = "mysql")]
pub(crate) async fn mysql() -> SqlHarness {
    let url = courier_test::env::mysql_url();
    let pool = tokio::time::timeout(
        Duration::from_secs(30),
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(2)
            .connect(&url),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to MariaDB timed out"))
    .unwrap_or_else(|e| panic!("connecting to MariaDB failed: {e}"));
    let base = Dsn::parse(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .expose_without_query()
        .to_owned();
    SqlHarness {
        base,
        extra: String::new(),
        admin: Admin::MySql(pool),
        app: String::new(),
        made: Mutex::default(),
        dir: None,
        cleanup: courier_test::Cleanup::new(),
    }
}
