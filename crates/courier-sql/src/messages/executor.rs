//! The [`Backend`] contract on the message table: each operation one statement (or one short
//! transaction), through the dialect's hooks where it has its own.

use std::sync::Arc;

use async_trait::async_trait;

use super::{CHUNK, MessageDialect, Messages, limit};
use crate::Dialect;
use crate::backend::{Backend, NewRow, StoredRow, Wake, sort_claimed};
use crate::migrate::{self, Applied};

#[async_trait]
impl<DB> Backend for Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> StoredRow: sqlx::FromRow<'r, DB::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (Option<i64>,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (String, i64, i64): sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::workers::Row: sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::schedules::Row: sqlx::FromRow<'r, DB::Row>,
    for<'r> crate::limits::Row: sqlx::FromRow<'r, DB::Row>,
{
    async fn setup(&self) -> Result<Vec<Applied>, sqlx::Error> {
        let mut applied = {
            let _turn = self.write_turn().await;
            migrate::migrate(
                self.writes(),
                &migrate::MESSAGES,
                &[("{messages}", &self.table)],
            )
            .await?
        };
        applied.extend(self.setup_workers().await?);
        let _turn = self.write_turn().await;
        let dedup = crate::dedup::dedup_table(&self.table);
        applied.extend(
            migrate::migrate(self.writes(), &migrate::DEDUP, &[("{dedup}", &dedup)]).await?,
        );
        Ok(applied)
    }

    async fn missing_migrations(&self) -> Result<Vec<migrate::Missing>, sqlx::Error> {
        let workers = crate::workers::workers_table(&self.table);
        let schedules = crate::schedules::schedules_table(&self.table);
        let paused = crate::paused::paused_table(&self.table);
        let limits = crate::limits::limits_table(&self.table);
        let dedup = crate::dedup::dedup_table(&self.table);
        let mut missing = migrate::missing(
            &self.pool,
            &migrate::MESSAGES,
            &[("{messages}", &self.table)],
        )
        .await?;
        missing.extend(
            migrate::missing(&self.pool, &migrate::WORKERS, &[("{workers}", &workers)]).await?,
        );
        missing.extend(
            migrate::missing(
                &self.pool,
                &migrate::SCHEDULES,
                &[
                    ("{schedules}", &schedules),
                    ("{paused}", &paused),
                    ("{limits}", &limits),
                ],
            )
            .await?,
        );
        missing
            .extend(migrate::missing(&self.pool, &migrate::DEDUP, &[("{dedup}", &dedup)]).await?);
        Ok(missing)
    }

    async fn setup_workers(&self) -> Result<Vec<Applied>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let workers = crate::workers::workers_table(&self.table);
        let mut applied =
            migrate::migrate(self.writes(), &migrate::WORKERS, &[("{workers}", &workers)]).await?;
        let schedules = crate::schedules::schedules_table(&self.table);
        applied.extend(
            migrate::migrate(
                self.writes(),
                &migrate::SCHEDULES,
                &[
                    ("{schedules}", &schedules),
                    ("{paused}", &crate::paused::paused_table(&self.table)),
                    ("{limits}", &crate::limits::limits_table(&self.table)),
                ],
            )
            .await?,
        );
        Ok(applied)
    }

    fn pauses(&self, name: &str, queue: &str) -> Box<dyn courier_core::Pausable> {
        Box::new(crate::paused::SqlPause::new(
            self.pool.clone(),
            &crate::paused::paused_table(&self.table),
            name,
            queue,
        ))
    }

    fn limits(&self, name: &str, queue: &str) -> Box<dyn courier_core::RateLimiter> {
        Box::new(crate::limits::SqlLimits::new(
            self.pool.clone(),
            &crate::limits::limits_table(&self.table),
            name,
            queue,
        ))
    }

    fn schedules(&self, name: &str, location: &str) -> Box<dyn courier_core::ScheduleStore> {
        Box::new(crate::schedules::SqlSchedules::new(
            self.pool.clone(),
            &crate::schedules::schedules_table(&self.table),
            name,
            location,
        ))
    }

    fn workers(
        &self,
        name: &str,
        location: &str,
        stale_after: std::time::Duration,
    ) -> Box<dyn courier_core::WorkerRegistry> {
        Box::new(crate::workers::SqlWorkers::new(
            self.pool.clone(),
            &crate::workers::workers_table(&self.table),
            name,
            location,
            stale_after,
        ))
    }

    async fn dedup_take(&self, key: &str, ttl_ms: i64) -> Result<bool, sqlx::Error> {
        let _turn = self.write_turn().await;
        if let Some(clear) = &self.dedup.clear_expired {
            sqlx::query(clear).bind(key).execute(self.writes()).await?;
        }
        let done = sqlx::query(&self.dedup.take)
            .bind(key)
            .bind(ttl_ms)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn dedup_release(&self, key: &str) -> Result<(), sqlx::Error> {
        let _turn = self.write_turn().await;
        sqlx::query(&self.dedup.release)
            .bind(key)
            .execute(self.writes())
            .await
            .map(drop)
    }

    async fn dedup_prune(&self, max: usize) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let done = sqlx::query(&self.dedup.prune)
            .bind(limit(max))
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn insert_keyed(
        &self,
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut tx = self.writes().begin().await?;
        let ids = self.insert_keyed_on(&mut tx, rows, keys).await?;
        tx.commit().await?;
        Ok(ids)
    }

    async fn insert_keyed_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
        keys: &[Option<(&str, i64)>],
    ) -> Result<Vec<Option<i64>>, sqlx::Error> {
        // No write turn: the caller's transaction may hold SQLite's write lock already.
        let Some(conn) = conn.downcast_mut::<DB::Connection>() else {
            return Err(sqlx::Error::Configuration(
                format!("the transaction is not on a {:?} connection", DB::DIALECT).into(),
            ));
        };
        self.insert_keyed_on(conn, rows, keys).await
    }

    async fn insert(&self, rows: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut conn = self.writes().acquire().await?;
        DB::insert(self, &mut conn, rows).await
    }

    async fn insert_in(
        &self,
        conn: &mut (dyn std::any::Any + Send),
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error> {
        // No write turn: the caller's transaction may hold SQLite's write lock already.
        let Some(conn) = conn.downcast_mut::<DB::Connection>() else {
            return Err(sqlx::Error::Configuration(
                format!("the transaction is not on a {:?} connection", DB::DIALECT).into(),
            ));
        };
        DB::insert(self, conn, rows).await
    }

    async fn oldest_age_ms(&self) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(&self.sql.oldest)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn claim(&self, max: usize, delivery_id: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
        let _turn = self.write_turn().await;
        if self.flow.is_some() && DB::DIALECT != Dialect::Sqlite {
            return self.claim_keyed(&[], max, delivery_id).await;
        }
        if DB::DIALECT == Dialect::Mysql {
            // SELECT ... FOR UPDATE SKIP LOCKED, then one UPDATE, in one READ COMMITTED
            // transaction (no gap locks, so claims, inserts and deletes do not deadlock).
            let mut tx = self.writes().begin().await?;
            let rows = self.claim_on(&mut tx, max, delivery_id).await?;
            tx.commit().await?;
            return Ok(rows);
        }
        let mut conn = self.writes().acquire().await?;
        self.claim_on(&mut conn, max, delivery_id).await
    }

    async fn delete_and_claim(
        &self,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Result<Vec<StoredRow>, sqlx::Error> {
        if deliveries.is_empty() {
            return self.claim(max, delivery_id).await;
        }
        let _turn = self.write_turn().await;
        if self.flow.is_some() && DB::DIALECT != Dialect::Sqlite {
            return self.claim_keyed(deliveries, max, delivery_id).await;
        }
        if let Some(rows) = DB::delete_and_claim(self, deliveries, max, delivery_id).await {
            let mut rows = rows?;
            sort_claimed(&mut rows);
            return Ok(rows);
        }
        // One transaction, one commit (one fsync where commits sync) for both halves: the
        // acks of the last batch and the claim of the next. Either both happen or neither.
        let mut tx = self.writes().begin().await?;
        self.for_deliveries_on(&mut tx, &self.sql.delete_head, deliveries)
            .await?;
        let rows = self.claim_on(&mut tx, max, delivery_id).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn drain(
        &self,
        name: &str,
        max: usize,
        hold_for: std::time::Duration,
        held: &tokio::sync::Notify,
    ) -> Option<Result<(Vec<StoredRow>, Box<dyn crate::relay::DrainHold>), sqlx::Error>> {
        DB::drain(self, name, max, hold_for, held).await
    }

    fn cursor(&self) -> Option<&dyn crate::backend::CursorRows> {
        DB::cursor(self)
    }

    async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
        if let Some(sql) = self.flow.as_ref().and_then(|f| f.next_due.as_ref()) {
            return sqlx::query_scalar(sql)
                .bind(self.redeliver_ms)
                .bind(self.queue.as_str())
                .bind(self.queue.as_str())
                .bind(self.redeliver_ms)
                .fetch_one(&self.pool)
                .await;
        }
        sqlx::query_scalar(&self.sql.next_due)
            .bind(self.redeliver_ms)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn delete(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        self.for_deliveries(&self.sql.delete_head, deliveries).await
    }

    async fn delete_one(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        self.by_id(&self.sql.delete_one, id, delivery_id).await
    }

    async fn delete_ids(&self, ids: &[i64]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let mut deleted = 0;
        for chunk in ids.chunks(CHUNK) {
            let sql = DB::DIALECT.render(&format!(
                "{}({})",
                self.sql.delete_ids,
                vec!["?"; chunk.len()].join(", ")
            ));
            let mut q = sqlx::query(&sql).bind(self.queue.as_str());
            for id in chunk {
                q = q.bind(*id);
            }
            deleted += DB::rows_affected(&q.execute(self.writes()).await?);
        }
        Ok(deleted)
    }

    async fn keepalive(&self, id: i64, delivery_id: i64) -> Result<u64, sqlx::Error> {
        self.by_id(&self.sql.keepalive, id, delivery_id).await
    }

    async fn keepalive_many(&self, deliveries: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        self.for_deliveries(&self.sql.keepalive_head, deliveries)
            .await
    }

    async fn reschedule(
        &self,
        id: i64,
        delivery_id: i64,
        row: &NewRow,
    ) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        if DB::DIALECT == Dialect::Postgres {
            let (n,): (i64,) = sqlx::query_as(&self.sql.reschedule)
                .bind(row.headers.as_str())
                .bind(row.priority)
                .bind(row.delay_ms)
                .bind(id)
                .bind(delivery_id)
                .bind(self.table.as_str())
                .bind(self.queue.as_str())
                .fetch_one(self.writes())
                .await?;
            return Ok(u64::try_from(n).unwrap_or(0));
        }
        let done = sqlx::query(&self.sql.reschedule)
            .bind(row.headers.as_str())
            .bind(row.priority)
            .bind(row.delay_ms)
            .bind(id)
            .bind(delivery_id)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn list(&self, n: usize) -> Result<Vec<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.sql.list)
            .bind(self.queue.as_str())
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
    }

    async fn find(&self, id: i64) -> Result<Option<StoredRow>, sqlx::Error> {
        sqlx::query_as(&self.sql.find)
            .bind(self.queue.as_str())
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    async fn count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&self.sql.count)
            .bind(self.queue.as_str())
            .fetch_one(&self.pool)
            .await
    }

    async fn key_loads(&self) -> Result<Vec<(String, i64, i64)>, sqlx::Error> {
        let Some(flow) = &self.flow else {
            return Ok(Vec::new());
        };
        sqlx::query_as(&flow.loads)
            .bind(self.redeliver_ms)
            .bind(self.redeliver_ms)
            .bind(self.queue.as_str())
            .fetch_all(&self.pool)
            .await
    }

    fn start_listener(&self, wake: &Arc<Wake>) {
        DB::start_listener(self, wake);
    }

    async fn slots_freed(&self) -> Result<(), sqlx::Error> {
        if let Some(sql) = self.flow.as_ref().and_then(|f| f.notify.as_ref()) {
            sqlx::query(sql)
                .bind(self.table.as_str())
                .bind(self.queue.as_str())
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    fn connection_ids(&self) -> Vec<u64> {
        DB::connection_ids(self)
    }

    async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
        DB::explain(self, e).await
    }
}
