//! Claiming rows: the plain claim, the claims of a queue with flow control, and the claim
//! lock they take turns under.

use super::{MessageDialect, Messages, limit};
use crate::Dialect;
use crate::backend::{StoredRow, sort_claimed};

/// A pooled connection that may hold MySQL's claim lock (a lock of the session, not of a
/// transaction): dropped while it may (a claim cancelled or failed between `GET_LOCK` and
/// `RELEASE_LOCK`), it leaves the pool and closes, and the server releases the lock, rather than
/// going back to the pool still holding it and stopping every other claim of the queue.
struct SessionGuard<DB: sqlx::Database> {
    conn: Option<sqlx::pool::PoolConnection<DB>>,
    may_hold: bool,
}

impl<DB: sqlx::Database> SessionGuard<DB> {
    fn conn(&mut self) -> Result<&mut DB::Connection, sqlx::Error> {
        self.conn.as_deref_mut().ok_or(sqlx::Error::PoolClosed)
    }
}

impl<DB: sqlx::Database> Drop for SessionGuard<DB> {
    fn drop(&mut self) {
        if self.may_hold
            && let Some(conn) = self.conn.take()
        {
            drop(conn.detach());
        }
    }
}

impl<DB> Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// MySQL: marks selected rows delivered under `delivery_id`.
    async fn mark_claimed(
        &self,
        conn: &mut DB::Connection,
        rows: &[StoredRow],
        delivery_id: i64,
    ) -> Result<(), sqlx::Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let sql = DB::DIALECT.render(&format!(
            "UPDATE {} SET delivered_at = {{now}}, delivery_id = ? WHERE id IN ({})",
            self.table,
            vec!["?"; rows.len()].join(", ")
        ));
        let mut q = sqlx::query(&sql).bind(delivery_id);
        for r in rows {
            q = q.bind(r.id);
        }
        q.execute(&mut *conn).await?;
        Ok(())
    }

    /// PostgreSQL and MySQL with flow control: deletes `deliveries` and claims in one
    /// transaction under the queue's claim lock, so that no two claims count the same free
    /// slots. PostgreSQL's is its own ([`MessageDialect::flow_claim`]); MySQL's lock is the
    /// session's, released only after the commit, so the next claim reads this one's rows.
    pub(super) async fn claim_keyed(
        &self,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'r> (Option<i64>,): sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        use sqlx::Connection as _;
        if let Some(rows) = DB::flow_claim(self, deliveries, max, delivery_id).await {
            return rows;
        }
        let Some(flow) = &self.flow else {
            return Ok(Vec::new());
        };
        let mut guard = SessionGuard {
            conn: Some(self.writes().acquire().await?),
            may_hold: false,
        };
        let session_lock = flow.unlock.is_some();
        if session_lock && let Some(lock) = &flow.lock {
            // From the moment the lock is asked for: a claim cancelled now must not hand the
            // session back to the pool holding it.
            guard.may_hold = true;
            let (got,): (Option<i64>,) = sqlx::query_as(lock)
                .bind(flow.lock_name.as_str())
                .bind(30_i64)
                .fetch_one(guard.conn()?)
                .await?;
            if got != Some(1) {
                guard.may_hold = false;
                return Err(sqlx::Error::Protocol(format!(
                    "the claim lock `{}` was not granted within 30 s",
                    flow.lock_name
                )));
            }
        }
        let claimed = async {
            let mut tx = guard.conn()?.begin().await?;
            if !deliveries.is_empty() {
                // No NOTIFY to send (PostgreSQL's claim is its own).
                self.for_deliveries_on(&mut tx, &self.sql.delete_head, deliveries)
                    .await?;
            }
            let rows = self.claim_on(&mut tx, max, delivery_id).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(rows)
        }
        .await;
        if session_lock && let Some(unlock) = &flow.unlock {
            // On failure the guard closes the session, which releases the lock.
            sqlx::query(unlock)
                .bind(flow.lock_name.as_str())
                .execute(guard.conn()?)
                .await?;
            guard.may_hold = false;
        }
        claimed
    }

    /// Runs one of the flow-control claims (`limited`: it counts the keys' busy slots).
    async fn flow_claim(
        &self,
        conn: &mut DB::Connection,
        claim: &str,
        limited: bool,
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if DB::DIALECT == Dialect::Mysql {
            let mut q = sqlx::query_as(claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms);
            if limited {
                q = q.bind(self.queue.as_str()).bind(self.redeliver_ms);
            }
            let rows: Vec<StoredRow> = q.bind(limit(max)).fetch_all(&mut *conn).await?;
            self.mark_claimed(conn, &rows, delivery_id).await?;
            return Ok(rows);
        }
        sqlx::query_as(claim)
            .bind(self.queue.as_str())
            .bind(self.redeliver_ms)
            .bind(limit(max))
            .bind(delivery_id)
            .fetch_all(&mut *conn)
            .await
    }

    /// Claims up to `max` rows on `conn` (MySQL: the select and the update, in the caller's
    /// transaction); returns them in claim order. With flow control, the caller holds the claim
    /// lock (MySQL) or the write lock (SQLite).
    pub(super) async fn claim_on(
        &self,
        conn: &mut DB::Connection,
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error>
    where
        for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        if let Some(flow) = &self.flow {
            let mut rows = Vec::new();
            if let Some((_, head)) = flow.head_claim(max) {
                rows = self
                    .flow_claim(conn, head, flow.next_due.is_some(), max, delivery_id)
                    .await?;
            }
            if rows.len() < max {
                let more = self
                    .flow_claim(
                        conn,
                        &flow.claim,
                        flow.next_due.is_some(),
                        max - rows.len(),
                        delivery_id,
                    )
                    .await?;
                rows.extend(more);
            }
            sort_claimed(&mut rows);
            return Ok(rows);
        }
        let mut rows: Vec<StoredRow> = if DB::DIALECT == Dialect::Mysql {
            let rows: Vec<StoredRow> = sqlx::query_as(&self.sql.claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .bind(limit(max))
                .fetch_all(&mut *conn)
                .await?;
            self.mark_claimed(conn, &rows, delivery_id).await?;
            rows
        } else {
            sqlx::query_as(&self.sql.claim)
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .bind(limit(max))
                .bind(delivery_id)
                .fetch_all(&mut *conn)
                .await?
        };
        sort_claimed(&mut rows);
        Ok(rows)
    }
}
