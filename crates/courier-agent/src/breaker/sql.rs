//! The breakers in a SQL table ([`SqlBreakers`]), and their lazily connected form
//! ([`LazySqlBreakers`]).

use std::fmt;

use async_trait::async_trait;

use super::{
    BreakerError, BreakerPolicy, BreakerRow, BreakerStore, Decision, Permit, State, decide, ms,
};

/// The default table of [`SqlBreakers`].
pub const DEFAULT_BREAKER_TABLE: &str = "courier_agent_breakers";

/// Breakers in a table of a SQL database (SQLite or PostgreSQL), shared by every process using
/// it: give it the run store's database ([`SqlBreakers::connect`] with the store's DSN, or
/// [`SqlBreakers::new`] with the pool the store was built on). [`SqlBreakers::setup`] creates
/// the table.
#[derive(Clone)]
pub struct SqlBreakers {
    pool: courier_sql::SqlPool,
    table: String,
}

impl fmt::Debug for SqlBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlBreakers")
            .field("dialect", &self.pool.dialect())
            .field("table", &self.table)
            .finish()
    }
}

fn db(doing: &'static str) -> impl FnOnce(sqlx::Error) -> BreakerError {
    move |e| BreakerError {
        doing,
        source: Box::new(e),
    }
}

/// Runs the same query text on whichever pool (see [`crate::sql::on_dialect`]).
macro_rules! on_pool {
    ($self:ident, $sql:expr, |$q:ident, $pool:ident| $body:expr) => {
        crate::sql::on_dialect!(
            &$self.pool,
            $sql,
            BreakerError {
                doing: "choosing a dialect",
                source: "circuit breakers need SQLite or PostgreSQL".into(),
            },
            |$q, $pool| $body
        )
    };
}

impl SqlBreakers {
    /// Breakers on `pool` in `table` (default [`DEFAULT_BREAKER_TABLE`]).
    ///
    /// # Errors
    /// A table name that is not a plain identifier.
    pub fn new(
        pool: impl Into<courier_sql::SqlPool>,
        table: Option<&str>,
    ) -> Result<Self, BreakerError> {
        let table = table.unwrap_or(DEFAULT_BREAKER_TABLE);
        if !courier_sql::is_valid_identifier(table) {
            return Err(BreakerError {
                doing: "naming the table",
                source: courier_sql::invalid_table_name(table).into(),
            });
        }
        Ok(Self {
            pool: pool.into(),
            table: table.to_owned(),
        })
    }

    /// Connects a small pool of its own to `dsn` (the run store's: `sqlite://`, `postgres://`)
    /// and creates the table when missing.
    ///
    /// # Errors
    /// An unsupported DSN, the database failed.
    pub async fn connect(dsn: &str, table: Option<&str>) -> Result<Self, BreakerError> {
        let settings = courier_sql::PoolSettings {
            max_connections: Some(2),
            ..courier_sql::PoolSettings::default()
        };
        let pool: courier_sql::SqlPool = if dsn.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            {
                courier_sql::sqlite_pool(dsn, &settings)
                    .await
                    .map_err(db("connecting"))?
                    .into()
            }
            #[cfg(not(feature = "sqlite"))]
            return Err(unsupported(dsn));
        } else if dsn.starts_with("postgres:") || dsn.starts_with("postgresql:") {
            #[cfg(feature = "postgres")]
            {
                courier_sql::postgres_pool(dsn, &settings)
                    .await
                    .map_err(db("connecting"))?
                    .0
                    .into()
            }
            #[cfg(not(feature = "postgres"))]
            return Err(unsupported(dsn));
        } else {
            return Err(unsupported(dsn));
        };
        let breakers = Self::new(pool, table)?;
        breakers.setup().await?;
        Ok(breakers)
    }

    /// Creates the table when missing.
    ///
    /// # Errors
    /// The database failed.
    pub async fn setup(&self) -> Result<(), BreakerError> {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (provider VARCHAR(200) PRIMARY KEY, state VARCHAR(16) NOT NULL, \
             failures BIGINT NOT NULL, window_start BIGINT NOT NULL, opened_at BIGINT NOT NULL, \
             probe_until BIGINT NOT NULL, updated_at BIGINT NOT NULL)",
            self.table
        );
        on_pool!(self, sql, |q, pool| q
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("creating the table")))
    }

    /// Drops the table (tests).
    ///
    /// # Errors
    /// The database failed.
    pub async fn drop_table(&self) -> Result<(), BreakerError> {
        let sql = format!("DROP TABLE IF EXISTS {}", self.table);
        on_pool!(self, sql, |q, pool| q
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("dropping the table")))
    }

    async fn row(&self, provider: &str) -> Result<Option<BreakerRow>, BreakerError> {
        let sql = format!(
            "SELECT provider, state, failures, window_start, opened_at, probe_until FROM {} WHERE provider = $1",
            self.table
        );
        on_pool!(self, sql, |q, pool| {
            let row = q
                .bind(provider)
                .fetch_optional(pool)
                .await
                .map_err(db("reading a breaker"))?;
            Ok(row.map(|r| read_row(&r)).transpose()?)
        })
    }
}

fn unsupported(dsn: &str) -> BreakerError {
    BreakerError {
        doing: "connecting",
        source: format!(
            "circuit breakers need a sqlite:// or postgres:// database, not `{}`",
            courier_core::redact(dsn)
        )
        .into(),
    }
}

fn read_row<R: sqlx::Row>(r: &R) -> Result<BreakerRow, BreakerError>
where
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let get = |name: &str| r.try_get::<i64, _>(name).map_err(db("reading a breaker"));
    Ok(BreakerRow {
        provider: r
            .try_get::<String, _>("provider")
            .map_err(db("reading a breaker"))?,
        state: State::parse(
            &r.try_get::<String, _>("state")
                .map_err(db("reading a breaker"))?,
        ),
        failures: u32::try_from(get("failures")?).unwrap_or(u32::MAX),
        window_start: get("window_start")?,
        opened_at: get("opened_at")?,
        probe_until: get("probe_until")?,
    })
}

#[async_trait]
impl BreakerStore for SqlBreakers {
    async fn acquire(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<Permit, BreakerError> {
        let Some(row) = self.row(provider).await? else {
            return Ok(Permit::Closed);
        };
        match decide(&row, policy, now) {
            Decision::Allow => Ok(Permit::Closed),
            Decision::Refuse => Ok(Permit::Open),
            Decision::TryProbe => {
                // Guarded: of the workers that saw it due, one turns it half-open.
                let sql = format!(
                    "UPDATE {} SET state = 'half_open', probe_until = $1, updated_at = $2 WHERE provider = $3 \
                     AND ((state = 'open' AND opened_at <= $4) OR (state = 'half_open' AND probe_until <= $2))",
                    self.table
                );
                let probe_until = now.saturating_add(ms(policy.probe_timeout));
                let due = now - ms(policy.cooldown);
                let taken = on_pool!(self, sql, |q, pool| q
                    .bind(probe_until)
                    .bind(now)
                    .bind(provider)
                    .bind(due)
                    .execute(pool)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(db("taking the probe")))?;
                Ok(if taken == 1 {
                    Permit::Probe
                } else {
                    Permit::Open
                })
            }
        }
    }

    async fn failure(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<(), BreakerError> {
        // One statement: the window's count, and the state it leads to, from the row's old values.
        let t = &self.table;
        let count = format!("(CASE WHEN {t}.window_start <= $3 THEN 1 ELSE {t}.failures + 1 END)");
        let sql = format!(
            "INSERT INTO {t} (provider, state, failures, window_start, opened_at, probe_until, updated_at) \
             VALUES ($1, CASE WHEN 1 >= $4 THEN 'open' ELSE 'closed' END, 1, $2, $2, 0, $2) \
             ON CONFLICT (provider) DO UPDATE SET \
             failures = CASE WHEN {t}.state = 'closed' THEN {count} ELSE {t}.failures END, \
             window_start = CASE WHEN {t}.state = 'closed' AND {t}.window_start <= $3 THEN $2 ELSE {t}.window_start END, \
             state = CASE WHEN {t}.state = 'half_open' THEN 'open' WHEN {t}.state = 'open' THEN 'open' \
                          WHEN {count} >= $4 THEN 'open' ELSE 'closed' END, \
             opened_at = CASE WHEN {t}.state = 'half_open' THEN $2 \
                              WHEN {t}.state = 'closed' AND {count} >= $4 THEN $2 ELSE {t}.opened_at END, \
             updated_at = $2"
        );
        let window_start = now - ms(policy.window);
        on_pool!(self, sql, |q, pool| q
            .bind(provider)
            .bind(now)
            .bind(window_start)
            .bind(i64::from(policy.failures))
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("counting a failure")))
    }

    async fn success(&self, provider: &str, permit: Permit, now: i64) -> Result<(), BreakerError> {
        if permit != Permit::Probe {
            return Ok(());
        }
        let sql = format!(
            "UPDATE {} SET state = 'closed', failures = 0, window_start = $1, updated_at = $1 \
             WHERE provider = $2 AND state = 'half_open'",
            self.table
        );
        on_pool!(self, sql, |q, pool| q
            .bind(now)
            .bind(provider)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(db("closing a breaker")))
    }

    async fn rows(&self) -> Result<Vec<BreakerRow>, BreakerError> {
        let sql = format!(
            "SELECT provider, state, failures, window_start, opened_at, probe_until FROM {} ORDER BY provider",
            self.table
        );
        on_pool!(self, sql, |q, pool| {
            let rows = q
                .fetch_all(pool)
                .await
                .map_err(db("reading the breakers"))?;
            rows.iter().map(read_row).collect()
        })
    }
}

/// [`SqlBreakers`] that connect (and create their table) on first use: for a caller that builds
/// its agents before it may await, like the command line.
pub struct LazySqlBreakers {
    dsn: String,
    table: Option<String>,
    cell: tokio::sync::OnceCell<SqlBreakers>,
}

impl fmt::Debug for LazySqlBreakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazySqlBreakers")
            .field("dsn", &courier_core::redact(&self.dsn))
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl LazySqlBreakers {
    /// Breakers on the database of `dsn`, connected on first use.
    #[must_use]
    pub fn new(dsn: impl Into<String>, table: Option<&str>) -> Self {
        Self {
            dsn: dsn.into(),
            table: table.map(str::to_owned),
            cell: tokio::sync::OnceCell::new(),
        }
    }

    async fn get(&self) -> Result<&SqlBreakers, BreakerError> {
        self.cell
            .get_or_try_init(|| SqlBreakers::connect(&self.dsn, self.table.as_deref()))
            .await
    }
}

#[async_trait]
impl BreakerStore for LazySqlBreakers {
    async fn acquire(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<Permit, BreakerError> {
        self.get().await?.acquire(provider, policy, now).await
    }

    async fn failure(
        &self,
        provider: &str,
        policy: &BreakerPolicy,
        now: i64,
    ) -> Result<(), BreakerError> {
        self.get().await?.failure(provider, policy, now).await
    }

    async fn success(&self, provider: &str, permit: Permit, now: i64) -> Result<(), BreakerError> {
        self.get().await?.success(provider, permit, now).await
    }

    async fn rows(&self) -> Result<Vec<BreakerRow>, BreakerError> {
        self.get().await?.rows().await
    }
}
