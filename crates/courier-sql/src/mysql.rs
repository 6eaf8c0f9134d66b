//! MySQL 8 / MariaDB 10.6+: sessions run READ COMMITTED (no gap locks, so claims, inserts and
//! deletes do not deadlock each other; a deadlock that still happens is retried) in UTC. sqlx
//! connects with `CLIENT_FOUND_ROWS`, so affected rows count rows matched. What is MySQL's own:
//! MariaDB inserts with `RETURNING id`; MySQL (no `RETURNING`) inserts row by row in one
//! transaction, reading `LAST_INSERT_ID()`; the pool knows its connections' server ids.

use async_trait::async_trait;
use sqlx::MySql;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};

use crate::backend::NewRow;
use crate::messages::{CHUNK, MessageDialect, Messages, bind_key, bind_row};
use crate::pool::{ConnectionIds, Hidden, PoolSettings, explain_timeout, mysql_pool};
use crate::{Dialect, SqlOptions};

/// What MySQL keeps beside its pool.
#[derive(Debug)]
pub(crate) struct MySqlState {
    /// How connections open, for [`MessageDialect::explain`].
    connect: Hidden<MySqlConnectOptions>,
    mariadb: bool,
    connection_ids: ConnectionIds,
}

pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Messages<MySql>, sqlx::Error> {
    let settings = PoolSettings {
        read_committed: true,
        ..PoolSettings::from(o)
    };
    let (pool, connect, connection_ids) = mysql_pool(url, &settings).await?;
    on_pool(pool, connect, connection_ids, o).await
}

/// The message table on the application's pool: its sessions keep the application's settings
/// (Courier's own pools run READ COMMITTED in UTC; deadlocks that REPEATABLE READ's gap locks
/// cause are retried).
pub(crate) async fn from_pool(
    pool: sqlx::MySqlPool,
    o: &SqlOptions,
) -> Result<Messages<MySql>, sqlx::Error> {
    let connect = (*pool.connect_options()).clone();
    on_pool(pool, connect, ConnectionIds::default(), o).await
}

async fn on_pool(
    pool: sqlx::MySqlPool,
    connect: MySqlConnectOptions,
    connection_ids: ConnectionIds,
    o: &SqlOptions,
) -> Result<Messages<MySql>, sqlx::Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await?;
    let state = MySqlState {
        connect: Hidden(connect),
        mariadb: version.to_ascii_lowercase().contains("mariadb"),
        connection_ids,
    };
    Ok(Messages::new(pool, o, state))
}

fn insert_sql(table: &str, rows: usize, returning: bool, keyed: bool) -> String {
    let now = Dialect::Mysql.now_ms_sql();
    let (key, mark) = if keyed {
        (", concurrency_key", ", ?")
    } else {
        ("", "")
    };
    let values = vec![format!("(?, ?, ?, ?, {now}, {now} + ?{mark})"); rows].join(", ");
    format!(
        "INSERT INTO {table} (queue_name, body, headers, priority, created_at, available_at{key}) VALUES {values}{}",
        if returning { " RETURNING id" } else { "" }
    )
}

#[async_trait]
impl MessageDialect for MySql {
    type State = MySqlState;

    async fn insert(
        m: &Messages<Self>,
        conn: &mut MySqlConnection,
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error> {
        // One transaction (a savepoint inside the caller's).
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let mut ids = Vec::with_capacity(rows.len());
        // MariaDB returns the ids of a multi-row insert; MySQL gives only the last one, so it
        // inserts one row per statement.
        let chunk_len = if m.state.mariadb { CHUNK } else { 1 };
        for chunk in rows.chunks(chunk_len) {
            let keyed = m.flow.is_some();
            let sql = insert_sql(&m.table, chunk.len(), m.state.mariadb, keyed);
            let mut q = sqlx::query(&sql);
            for r in chunk {
                q = bind_row(q, &m.queue, r);
                if keyed {
                    q = bind_key(q, r);
                }
            }
            if m.state.mariadb {
                let mut got = Vec::with_capacity(chunk.len());
                for row in q.fetch_all(&mut *tx).await? {
                    got.push(sqlx::Row::try_get::<i64, _>(&row, 0)?);
                }
                got.sort_unstable();
                ids.extend(got);
            } else {
                let done = q.execute(&mut *tx).await?;
                ids.push(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX));
            }
        }
        tx.commit().await?;
        Ok(ids)
    }

    fn connection_ids(m: &Messages<Self>) -> Vec<u64> {
        m.state.connection_ids.snapshot()
    }

    async fn explain(m: &Messages<Self>, e: sqlx::Error) -> sqlx::Error {
        explain_timeout::<MySqlConnection>(&m.state.connect.0, e).await
    }
}
