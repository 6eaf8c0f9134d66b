//! The statements of the Doctrine layout on each database. Datetimes are bound as text
//! (`Y-m-d H:i:s`, PHP's zone): PostgreSQL casts them to its `TIMESTAMP(0)` columns, MariaDB
//! converts them to its `DATETIME` columns, SQLite stores them as Doctrine does, as text that
//! sorts as time.

use courier_core::{TransportError, TransportErrorKind};

#[cfg(feature = "mysql")]
use super::mysql::{MYSQL_CLAIM_TRIES, MYSQL_CREATE, lock_conflict, mysql_claim, mysql_index};
#[cfg(feature = "mysql")]
use super::rows::{insert_values, row_values};
#[cfg(feature = "sqlite")]
use super::sqlite::{SQLITE_CREATE, SqliteDb, sqlite_insert_many};

/// A claimed row.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) body: String,
    pub(crate) headers: String,
}

/// The database behind the transport.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    /// PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    /// SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteDb),
    /// MariaDB (10.6 or later: `SKIP LOCKED`, `INSERT ... RETURNING`).
    #[cfg(feature = "mysql")]
    Mysql(sqlx::MySqlPool),
}

#[cfg(feature = "postgres")]
const PG_CREATE: &str = "CREATE TABLE IF NOT EXISTS {t} (id BIGSERIAL NOT NULL, body TEXT NOT NULL, \
     headers TEXT NOT NULL, queue_name VARCHAR(190) NOT NULL, \
     created_at TIMESTAMP(0) WITHOUT TIME ZONE NOT NULL, \
     available_at TIMESTAMP(0) WITHOUT TIME ZONE NOT NULL, \
     delivered_at TIMESTAMP(0) WITHOUT TIME ZONE DEFAULT NULL, PRIMARY KEY(id))";

/// PHP's indexes: `queue_name`, `available_at`, `delivered_at`.
pub(crate) const INDEXES: [&str; 3] = ["queue_name", "available_at", "delivered_at"];

#[cfg(feature = "postgres")]
/// The claim on PostgreSQL. `id = ANY(ARRAY(...))` rather than `id IN (...)`: the claimed ids are found by the primary
/// key, where `IN` lets the planner hash-join them against a scan of the whole table.
const PG_CLAIM: &str = "UPDATE {t} SET delivered_at = $1::timestamp WHERE id = ANY(ARRAY(\
     SELECT id FROM {t} WHERE queue_name = $2 \
     AND (delivered_at IS NULL OR delivered_at < $3::timestamp) AND available_at <= $1::timestamp \
     ORDER BY available_at ASC LIMIT $4 FOR UPDATE SKIP LOCKED)) RETURNING id, body, headers";

#[cfg(feature = "sqlite")]
/// The claim on SQLite. `+queue_name` keeps SQLite's planner off the `queue_name` index, which (one queue per table
/// being the rule) matches every row and leaves all of them to sort on each claim: it walks the
/// `available_at` index instead, in the statement's order, and stops at the limit.
const SQLITE_CLAIM: &str = "UPDATE {t} SET delivered_at = ?1 WHERE id IN (\
     SELECT id FROM {t} WHERE +queue_name = ?2 \
     AND (delivered_at IS NULL OR delivered_at < ?3) AND available_at <= ?1 \
     ORDER BY available_at ASC LIMIT ?4) RETURNING id, body, headers";

fn table(sql: &str, table: &str) -> String {
    sql.replace("{t}", table)
}

/// `DELETE ... WHERE id IN (?, ...)` for `n` ids, bound: one statement per batch size, prepared
/// once and then found in the connection's statement cache.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn delete_list(t: &str, n: usize) -> String {
    let list = vec!["?"; n].join(", ");
    format!("DELETE FROM {t} WHERE id IN ({list})")
}

impl Pool {
    pub(crate) async fn connect(name: &str, url: &str) -> Result<Self, TransportError> {
        let config = |context: String| {
            TransportError::new(TransportErrorKind::Config, name.to_owned()).with_context(context)
        };
        let connection = |e: sqlx::Error| {
            TransportError::new(TransportErrorKind::Connection, name.to_owned())
                .with_context("connecting")
                .with_source(e)
        };
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(Self::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(4)
                    // The claim's `ORDER BY available_at` read from the `available_at` index,
                    // never all of a queue's rows sorted: the planner's choice on a table it
                    // has no statistics for yet (as Courier's own SQL transport plans).
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::query("SET enable_sort = off")
                                .execute(conn)
                                .await
                                .map(drop)
                        })
                    })
                    .connect(url)
                    .await
                    .map_err(connection)?,
            )),
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok(Self::Sqlite(
                SqliteDb::connect(url, config, connection).await?,
            )),
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                use std::str::FromStr;
                let options = sqlx::mysql::MySqlConnectOptions::from_str(url)
                    .map_err(|e| config(format!("invalid MySQL URL: {e}")))?;
                Ok(Self::Mysql(
                    sqlx::mysql::MySqlPoolOptions::new()
                        .max_connections(4)
                        // Fewer gap locks, so fewer deadlocks with PHP's `FOR UPDATE`.
                        .after_connect(|conn, _| {
                            Box::pin(async move {
                                sqlx::query(
                                    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                                )
                                .execute(conn)
                                .await
                                .map(drop)
                            })
                        })
                        .connect_with(options)
                        .await
                        .map_err(connection)?,
                ))
            }
            other => Err(config(format!(
                "unknown scheme `{other}` for Symfony's Doctrine table (postgres, sqlite or mysql, with their features)"
            ))),
        }
    }

    pub(crate) fn messaging_system(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "postgresql",
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "sqlite",
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => "mysql",
        }
    }

    pub(crate) async fn setup(&self, t: &str) -> Result<(), sqlx::Error> {
        #[cfg(any(feature = "postgres", feature = "sqlite"))]
        let indexes = || {
            INDEXES.map(|column| {
                format!("CREATE INDEX IF NOT EXISTS idx_{t}_{column} ON {t} ({column})")
            })
        };
        let statements: Vec<String> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => std::iter::once(table(PG_CREATE, t))
                .chain(indexes())
                .collect(),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => std::iter::once(table(SQLITE_CREATE, t))
                .chain(indexes())
                .collect(),
            // The indexes in the table's statement, as DBAL writes it.
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => {
                let mut create = table(MYSQL_CREATE, t);
                for column in INDEXES {
                    create = create.replace(&format!("{{i_{column}}}"), &mysql_index(t, column));
                }
                vec![create]
            }
        };
        for statement in statements {
            match self {
                #[cfg(feature = "postgres")]
                Self::Postgres(pool) => sqlx::query(&statement).execute(pool).await.map(drop)?,
                #[cfg(feature = "sqlite")]
                Self::Sqlite(db) => {
                    let _turn = db.write_turn().await;
                    sqlx::query(&statement).execute(&db.pool).await.map(drop)?;
                }
                #[cfg(feature = "mysql")]
                Self::Mysql(pool) => sqlx::query(&statement).execute(pool).await.map(drop)?,
            }
        }
        Ok(())
    }

    async fn insert_once(
        &self,
        t: &str,
        body: &str,
        headers: &str,
        queue: &str,
        created: &str,
        available: &str,
    ) -> Result<i64, sqlx::Error> {
        // The values in each dialect's placeholders, the same binds on each database.
        macro_rules! insert {
            ($pool:expr, $values:literal) => {{
                let sql = format!(
                    "INSERT INTO {t} (body, headers, queue_name, created_at, available_at) \
                     VALUES {} RETURNING id",
                    $values
                );
                sqlx::query_scalar(&sql)
                    .bind(body)
                    .bind(headers)
                    .bind(queue)
                    .bind(created)
                    .bind(available)
                    .fetch_one($pool)
                    .await
            }};
        }
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => insert!(pool, "($1, $2, $3, $4::timestamp, $5::timestamp)"),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => {
                let _turn = db.write_turn().await;
                insert!(&db.pool, "(?1, ?2, ?3, ?4, ?5)")
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => insert!(pool, "(?, ?, ?, ?, ?)"),
        }
    }

    /// One try of [`Pool::insert_many`].
    async fn insert_many_once(
        &self,
        t: &str,
        rows: &[(String, String, String)],
        queue: &str,
        created: &str,
    ) -> Result<Vec<i64>, sqlx::Error> {
        let mut ids: Vec<i64> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                // The rows as three arrays: one statement for every batch size, three binds
                // rather than three per row, and the ids back as one array.
                let sql = format!(
                    "WITH ins AS (INSERT INTO {t} (body, headers, queue_name, created_at, available_at) \
                     SELECT r.body, r.headers, $1, $2::timestamp, r.available::timestamp \
                     FROM UNNEST($3::text[], $4::text[], $5::text[]) AS r(body, headers, available) \
                     RETURNING id) SELECT ARRAY(SELECT id FROM ins)"
                );
                let bodies: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
                let headers: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
                let available: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
                sqlx::query_scalar(&sql)
                    .bind(queue)
                    .bind(created)
                    .bind(bodies)
                    .bind(headers)
                    .bind(available)
                    .fetch_one(pool)
                    .await?
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => sqlite_insert_many(db, t, rows, queue, created).await?,
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => {
                let sql = format!("{} RETURNING id", insert_values(t, rows.len()));
                let mut query = sqlx::query_scalar(&sql);
                for value in row_values(rows, queue, created) {
                    query = query.bind(value);
                }
                query.fetch_all(pool).await?
            }
        };
        // One statement takes its ids in the order of its rows.
        ids.sort_unstable();
        Ok(ids)
    }

    /// Deletes the rows `acked` (the acks of the last batch) and claims up to `max` rows: on
    /// PostgreSQL in one statement, on SQLite in one transaction (one commit, one turn of the
    /// write lock), on MySQL the delete and then the claim.
    pub(crate) async fn claim(
        &self,
        t: &str,
        queue: &str,
        now: &str,
        horizon: &str,
        max: usize,
        acked: &[i64],
    ) -> Result<Vec<Row>, sqlx::Error> {
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, String)> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) if acked.is_empty() => {
                sqlx::query_as(&table(PG_CLAIM, t))
                    .bind(now)
                    .bind(queue)
                    .bind(horizon)
                    .bind(limit)
                    .fetch_all(pool)
                    .await?
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                // A data-modifying CTE runs whether or not it is read. The rows it deletes
                // are this worker's, delivered within the horizon: the claim skips them.
                let sql = format!(
                    "WITH gone AS (DELETE FROM {t} WHERE id = ANY($5)) {}",
                    table(PG_CLAIM, t)
                );
                sqlx::query_as(&sql)
                    .bind(now)
                    .bind(queue)
                    .bind(horizon)
                    .bind(limit)
                    .bind(acked)
                    .fetch_all(pool)
                    .await?
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => {
                let (pool, _turn) = (&db.pool, db.write_turn().await);
                let claim = table(SQLITE_CLAIM, t);
                let claim = sqlx::query_as(&claim)
                    .bind(now)
                    .bind(queue)
                    .bind(horizon)
                    .bind(limit);
                if acked.is_empty() {
                    claim.fetch_all(pool).await?
                } else {
                    let mut tx = pool.begin().await?;
                    let delete = delete_list(t, acked.len());
                    let mut query = sqlx::query(&delete);
                    for id in acked {
                        query = query.bind(id);
                    }
                    query.execute(&mut *tx).await?;
                    let rows = claim.fetch_all(&mut *tx).await?;
                    tx.commit().await?;
                    rows
                }
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => {
                if !acked.is_empty() {
                    self.delete_many_once(t, acked).await?;
                }
                let mut tries = 0;
                loop {
                    match mysql_claim(pool, t, queue, now, horizon, limit).await {
                        Err(e) if lock_conflict(&e) && tries + 1 < MYSQL_CLAIM_TRIES => tries += 1,
                        Err(e) if lock_conflict(&e) => break Vec::new(),
                        other => break other?,
                    }
                }
            }
        };
        Ok(rows
            .into_iter()
            .map(|(id, body, headers)| Row { id, body, headers })
            .collect())
    }

    async fn delete_once(&self, t: &str, id: i64) -> Result<(), sqlx::Error> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let sql = format!("DELETE FROM {t} WHERE id = $1");
                sqlx::query(&sql).bind(id).execute(pool).await.map(drop)
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => {
                let _turn = db.write_turn().await;
                let sql = format!("DELETE FROM {t} WHERE id = ?1");
                sqlx::query(&sql).bind(id).execute(&db.pool).await.map(drop)
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => {
                let sql = format!("DELETE FROM {t} WHERE id = ?");
                sqlx::query(&sql).bind(id).execute(pool).await.map(drop)
            }
        }
    }

    /// One try of [`Pool::delete_many`].
    /// The ids are bound, not written into the text: one statement per batch size, prepared
    /// once and then found in the connection's statement cache (one array on PostgreSQL).
    async fn delete_many_once(&self, t: &str, ids: &[i64]) -> Result<(), sqlx::Error> {
        #[cfg(any(feature = "sqlite", feature = "mysql"))]
        let placeholders = || delete_list(t, ids.len());
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query(&format!("DELETE FROM {t} WHERE id = ANY($1)"))
                .bind(ids)
                .execute(pool)
                .await
                .map(drop),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => {
                let _turn = db.write_turn().await;
                let sql = placeholders();
                let mut query = sqlx::query(&sql);
                for id in ids {
                    query = query.bind(id);
                }
                query.execute(&db.pool).await.map(drop)
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => {
                let sql = placeholders();
                let mut query = sqlx::query(&sql);
                for id in ids {
                    query = query.bind(id);
                }
                query.execute(pool).await.map(drop)
            }
        }
    }

    async fn touch_once(&self, t: &str, id: i64, now: &str) -> Result<(), sqlx::Error> {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let sql = format!(
                    "UPDATE {t} SET delivered_at = $2::timestamp WHERE id = $1 AND delivered_at IS NOT NULL"
                );
                sqlx::query(&sql)
                    .bind(id)
                    .bind(now)
                    .execute(pool)
                    .await
                    .map(drop)
            }
            #[cfg(feature = "sqlite")]
            Self::Sqlite(db) => {
                let _turn = db.write_turn().await;
                let sql = format!(
                    "UPDATE {t} SET delivered_at = ?2 WHERE id = ?1 AND delivered_at IS NOT NULL"
                );
                sqlx::query(&sql)
                    .bind(id)
                    .bind(now)
                    .execute(&db.pool)
                    .await
                    .map(drop)
            }
            #[cfg(feature = "mysql")]
            Self::Mysql(pool) => {
                let sql = format!(
                    "UPDATE {t} SET delivered_at = ? WHERE id = ? AND delivered_at IS NOT NULL"
                );
                sqlx::query(&sql)
                    .bind(now)
                    .bind(id)
                    .execute(pool)
                    .await
                    .map(drop)
            }
        }
    }
}

/// The writes, each sent again while the database refuses it transiently
/// ([`courier_sql::retry_transient`]: a deadlock, a lock wait timeout, a dropped connection).
/// PHP's `SELECT ... FOR UPDATE` on MariaDB takes gap locks, so a write on a table PHP workers
/// share can be refused although it conflicts with nothing of Courier's own. Each write is one
/// statement, rolled back whole when refused, so sending it again cannot apply it twice.
impl Pool {
    /// Inserts a row; its id.
    pub(crate) async fn insert(
        &self,
        t: &str,
        body: &str,
        headers: &str,
        queue: &str,
        created: &str,
        available: &str,
    ) -> Result<i64, sqlx::Error> {
        courier_sql::retry_transient("send", || {
            self.insert_once(t, body, headers, queue, created, available)
        })
        .await
    }

    /// Inserts rows (`body`, `headers`, `available_at`) in one statement, all created at
    /// `created`; their ids in order.
    pub(crate) async fn insert_many(
        &self,
        t: &str,
        rows: &[(String, String, String)],
        queue: &str,
        created: &str,
    ) -> Result<Vec<i64>, sqlx::Error> {
        courier_sql::retry_transient("send a batch", || {
            self.insert_many_once(t, rows, queue, created)
        })
        .await
    }

    /// Deletes the row `id` (an ack or a reject).
    pub(crate) async fn delete(&self, t: &str, id: i64) -> Result<(), sqlx::Error> {
        courier_sql::retry_transient("delete", || self.delete_once(t, id)).await
    }

    /// Deletes the rows with these ids, in one statement.
    pub(crate) async fn delete_many(&self, t: &str, ids: &[i64]) -> Result<(), sqlx::Error> {
        courier_sql::retry_transient("delete a batch", || self.delete_many_once(t, ids)).await
    }

    /// Moves a claimed row's `delivered_at` to `now` (a keepalive).
    pub(crate) async fn touch(&self, t: &str, id: i64, now: &str) -> Result<(), sqlx::Error> {
        courier_sql::retry_transient("keepalive", || self.touch_once(t, id, now)).await
    }
}
