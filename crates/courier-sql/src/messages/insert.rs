//! Inserting: a row's binds, and the insert of rows with deduplication keys.

use super::{MessageDialect, Messages};
use crate::backend::NewRow;

/// Binds one row of a multi-row insert: queue, body, headers, priority, delay.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_row<'q, DB>(
    q: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    queue: &'q str,
    row: &'q NewRow,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(queue)
        .bind(row.body.as_str())
        .bind(row.headers.as_str())
        .bind(row.priority)
        .bind(row.delay_ms)
}

/// Binds a row's concurrency key (after [`bind_row`], on a keyed queue).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_key<'q, DB>(
    q: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    row: &'q NewRow,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: sqlx::Database,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    q.bind(row.key.as_deref())
}

impl<DB> Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// Takes a deduplication key on `conn` (in the caller's transaction): `true` when taken.
    pub(super) async fn take_key_on(
        &self,
        conn: &mut DB::Connection,
        key: &str,
        ttl_ms: i64,
    ) -> Result<bool, sqlx::Error>
    where
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if let Some(clear) = &self.dedup.clear_expired {
            sqlx::query(clear).bind(key).execute(&mut *conn).await?;
        }
        let done = sqlx::query(&self.dedup.take)
            .bind(key)
            .bind(ttl_ms)
            .execute(&mut *conn)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// Takes the rows' keys, then inserts the rows whose key was free (and those without one),
    /// on `conn`, inside a transaction of the caller's; each row's id, `None` when held.
    pub(super) async fn insert_keyed_on(
        &self,
        conn: &mut DB::Connection,
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error>
    where
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        let mut fresh = Vec::with_capacity(rows.len());
        for i in 0..rows.len() {
            fresh.push(match keys.get(i).copied().flatten() {
                Some((key, ttl_ms)) => self.take_key_on(conn, key, ttl_ms).await?,
                None => true,
            });
        }
        let ids = if fresh.iter().all(|f| *f) {
            DB::insert(self, conn, rows).await?
        } else {
            let kept: Vec<NewRow> = rows
                .iter()
                .zip(&fresh)
                .filter(|(_, f)| **f)
                .map(|(r, _)| r.clone())
                .collect();
            if kept.is_empty() {
                Vec::new()
            } else {
                DB::insert(self, conn, &kept).await?
            }
        };
        let kept = fresh.iter().filter(|f| **f).count();
        if ids.len() != kept {
            return Err(sqlx::Error::Protocol(format!(
                "inserted {} rows for {kept} messages",
                ids.len()
            )));
        }
        let mut ids = ids.into_iter();
        Ok(fresh
            .into_iter()
            .map(|f| if f { ids.next() } else { None })
            .collect())
    }
}
