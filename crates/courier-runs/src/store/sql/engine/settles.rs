//! Settling runs on SQL: the guarded settle (on SQLite through the write combiner), the failure
//! of a queued run, resume, cancel, and a run's pending effect.

use uuid::Uuid;

#[cfg(feature = "sqlite")]
use super::db;
use super::{RunDialect, Runs, in_flight};
use crate::store::{Run, Settlement, StoreError};
use crate::{RunStatus, TerminationReason};

runs_impl! {
[impl<DB> Runs<DB>]
    /// [`RunStore::settle`](crate::RunStore::settle).
    pub(super) async fn settle_run(
        &self,
        id: Uuid,
        owner: Option<&str>,
        s: &Settlement,
    ) -> Result<bool, StoreError> {
        #[cfg(feature = "postgres")]
        if let Some(batches) = &self.batches
            && let Ok(done) = in_flight(batches.settle(id, owner, s)).await
        {
            return Ok(done);
        }
        let sql = if owner.is_some() {
            &self.q.settle_owned
        } else {
            &self.q.settle_interactive
        };
        #[cfg(feature = "sqlite")]
        if let Some(combiner) = &self.combiner {
            use super::combine::Bind;
            let mut binds = vec![
                Bind::Text(s.status.as_str().to_owned()),
                Bind::OptText(s.reason.map(|r| r.as_str().to_owned())),
                Bind::OptText(s.class.map(|c| c.as_str().to_owned())),
                Bind::OptJson(s.output.clone()),
                Bind::Int(i64::from(s.status.is_terminal())),
                Bind::Text(id.hyphenated().to_string()),
            ];
            if let Some(owner) = owner {
                binds.push(Bind::Text(owner.to_owned()));
            }
            let write = super::combine::Write {
                sql: sql.clone(),
                statements: 1,
                binds,
            };
            let written = in_flight(combiner.write(write))
                .await
                .map_err(db("settle"))?;
            return Ok(written.changes.first().is_some_and(|n| *n > 0));
        }
        let mut q = sqlx::query(sql)
            .bind(s.status.as_str())
            .bind(s.reason.map(|r| r.as_str()))
            .bind(s.class.map(|c| c.as_str()))
            .bind(s.output.clone())
            .bind(i64::from(s.status.is_terminal()))
            .bind(DB::id(id));
        if let Some(owner) = owner {
            q = q.bind(owner);
        }
        let _turn = self.turn().await;
        self.matched("settle", in_flight(q.execute(&self.pool)).await)
    }

    /// [`RunStore::fail_queued`](crate::RunStore::fail_queued).
    pub(super) async fn fail_queued_run(
        &self,
        id: Uuid,
        reason: TerminationReason,
    ) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.fail_queued)
            .bind(reason.as_str())
            .bind(DB::id(id));
        self.matched("fail queued", q.execute(&self.pool).await)
    }

    /// [`RunStore::resume`](crate::RunStore::resume).
    pub(super) async fn resume_run(&self, id: Uuid, from: RunStatus) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.resume)
            .bind(DB::id(id))
            .bind(from.as_str());
        self.matched("resume", q.execute(&self.pool).await)
    }

    /// [`RunStore::cancel`](crate::RunStore::cancel).
    pub(super) async fn cancel_run(&self, id: Uuid) -> Result<bool, StoreError> {
        let q = sqlx::query(&self.q.cancel).bind(DB::id(id));
        self.matched("cancel", q.execute(&self.pool).await)
    }

    /// [`RunStore::set_pending_effect`](crate::RunStore::set_pending_effect).
    pub(super) async fn write_pending_effect(
        &self,
        id: Uuid,
        owner: Option<&str>,
        effect: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = if owner.is_some() {
            &self.q.effect_owned
        } else {
            &self.q.effect_interactive
        };
        let mut q = sqlx::query(sql).bind(effect).bind(DB::id(id));
        if let Some(owner) = owner {
            q = q.bind(owner);
        }
        self.matched("pending effect", in_flight(q.execute(&self.pool)).await)
    }
}
