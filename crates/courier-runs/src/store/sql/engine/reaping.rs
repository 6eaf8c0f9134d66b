//! The reaper's statements on SQL: overdue queued runs dispatched again, stale runs requeued or
//! dead-lettered.

use std::time::Duration;

use uuid::Uuid;

use super::{RunDialect, Runs, limit, rows_error};
use crate::TerminationReason;
use crate::store::{Run, StoreError, lease_ms};

runs_impl! {
[impl<DB> Runs<DB>]
    /// [`RunStore::select_overdue`](crate::RunStore::select_overdue).
    pub(super) async fn overdue_runs(
        &self,
        after: Duration,
        n: usize,
    ) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as(&self.q.select_overdue)
            .bind(lease_ms(after))
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("select overdue"))
    }

    /// [`RunStore::redispatch_overdue`](crate::RunStore::redispatch_overdue).
    pub(super) async fn redispatch_overdue_run(
        &self,
        id: Uuid,
        after: Duration,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.redispatch_overdue)
            .bind(DB::id(id))
            .bind(lease_ms(after));
        self.matched("re-dispatch overdue", q.execute(&self.pool).await)
    }

    /// [`RunStore::redispatch_queued`](crate::RunStore::redispatch_queued).
    pub(super) async fn redispatch_queued_run(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.redispatch_queued).bind(DB::id(id));
        self.matched("re-dispatch queued", q.execute(&self.pool).await)
    }

    /// [`RunStore::select_stale`](crate::RunStore::select_stale).
    pub(super) async fn stale_runs(&self, n: usize) -> Result<Vec<Run>, StoreError> {
        sqlx::query_as(&self.q.select_stale)
            .bind(limit(n))
            .fetch_all(&self.pool)
            .await
            .map_err(rows_error("select stale"))
    }

    /// [`RunStore::requeue_stale`](crate::RunStore::requeue_stale).
    pub(super) async fn requeue_stale_run(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.requeue_stale).bind(DB::id(id));
        self.matched("stale requeue", q.execute(&self.pool).await)
    }

    /// [`RunStore::dead_letter_stale`](crate::RunStore::dead_letter_stale).
    pub(super) async fn dead_letter_stale_run(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.dead_letter_stale)
            .bind(reason.as_str())
            .bind(DB::id(id));
        self.matched("stale dead-letter", q.execute(&self.pool).await)
    }
}
