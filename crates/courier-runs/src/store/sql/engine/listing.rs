//! The run listing of the dashboard and `runs list`: keyset pages and status counts.
//!
//! A page is one statement, `WHERE [status = '<status>'] [AND agent = ?] [AND <before|after
//! cursor>] ORDER BY created_at, id LIMIT ?`, backed by the `(created_at, id)`, `(status,
//! created_at, id)` and `(agent, created_at, id)` indexes of migration 0005: the database seeks
//! to the cursor and reads `limit` rows, however deep the page. The cursor condition is written
//! `created_at <= ? AND (created_at < ? OR id < ?)` so that every dialect turns it into an index
//! range on `created_at` (a row-value comparison is not a range on every MySQL version).
//!
//! The status is written into the statement (one statement per status, the enum's own
//! constants), not bound: a prepared statement's generic plan on PostgreSQL estimates a bound
//! status as common as any other, and then walks `(created_at, id)` filtering on it, which for a
//! rare status deep in the list reads every older run; a written one is weighed by the
//! column's statistics, and a rare status seeks in `(status, created_at, id)`.

use courier_sql::Dialect;

use super::row::{column, rows_error};
use super::{RunDialect, Runs, limit};
use crate::RunStatus;
use crate::store::sql::queries::COLUMNS;
use crate::store::{PageFrom, Run, RunPageQuery, StoreError};

/// Every page statement, by filter and direction, rendered once.
#[derive(Debug)]
pub(in crate::store::sql) struct PageQueries {
    /// By [`slot`]: `[status][agent?][from]`.
    pages: Vec<String>,
    count_by_status: String,
}

/// The status filters of a page: none, or one of the eight statuses.
const FILTERS: usize = 9;

/// The status filter's place among the statements: an exhaustive match, so that a new status
/// does not compile until it has its own (a status without one would page every run).
fn status_slot(status: Option<RunStatus>) -> usize {
    match status {
        None => 0,
        Some(RunStatus::Queued) => 1,
        Some(RunStatus::Running) => 2,
        Some(RunStatus::WaitingForApproval) => 3,
        Some(RunStatus::WaitingForInput) => 4,
        Some(RunStatus::Waiting) => 5,
        Some(RunStatus::Completed) => 6,
        Some(RunStatus::Failed) => 7,
        Some(RunStatus::Cancelled) => 8,
    }
}

/// Where the statement of a page sits: by status filter, agent filtered or not, and from: 0
/// newest, 1 before, 2 after.
fn slot(status: Option<RunStatus>, agent: bool, from: PageFrom) -> usize {
    let from = match from {
        PageFrom::Newest => 0,
        PageFrom::Before(_) => 1,
        PageFrom::After(_) => 2,
    };
    (status_slot(status) * 2 + usize::from(agent)) * 3 + from
}

impl PageQueries {
    /// The statement for `q`.
    pub(in crate::store::sql) fn statement(&self, q: &RunPageQuery) -> &str {
        &self.pages[slot(q.status, q.agent.is_some(), q.from)]
    }

    pub(super) fn new(dialect: Dialect, runs: &str) -> Self {
        let mut pages = vec![String::new(); FILTERS * 6];
        let statuses = std::iter::once(None).chain(RunStatus::ALL.map(Some));
        for status in statuses {
            for agent in [false, true] {
                for (from, cond, order) in [
                    (PageFrom::Newest, None, "DESC"),
                    (PageFrom::Before(CURSOR), Some(("<=", "<")), "DESC"),
                    (PageFrom::After(CURSOR), Some((">=", ">")), "ASC"),
                ] {
                    let mut wheres = Vec::new();
                    if let Some(status) = status {
                        // The enum's own constant, never outside input.
                        wheres.push(format!("status = '{}'", status.as_str()));
                    }
                    if agent {
                        wheres.push("agent = ?".to_owned());
                    }
                    if let Some((wide, strict)) = cond {
                        wheres.push(format!(
                            "created_at {wide} ? AND (created_at {strict} ? OR id {strict} ?)"
                        ));
                    }
                    let filter = if wheres.is_empty() {
                        String::new()
                    } else {
                        format!(" WHERE {}", wheres.join(" AND "))
                    };
                    pages[slot(status, agent, from)] = dialect.render(&format!(
                        "SELECT {COLUMNS} FROM {runs}{filter} ORDER BY created_at {order}, id {order} LIMIT ?"
                    ));
                }
            }
        }
        Self {
            pages,
            count_by_status: dialect.render(&format!(
                "SELECT status, COUNT(*) AS n FROM {runs} GROUP BY status"
            )),
        }
    }
}

/// A placeholder cursor for picking a statement.
const CURSOR: crate::store::RunCursor = crate::store::RunCursor {
    created_at: 0,
    id: uuid::Uuid::nil(),
};

impl<DB> Runs<DB>
where
    DB: RunDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> Run: sqlx::FromRow<'r, DB::Row>,
    for<'r> String: sqlx::Decode<'r, DB>,
    for<'r> i64: sqlx::Decode<'r, DB>,
    for<'a> &'a str: sqlx::ColumnIndex<DB::Row>,
{
    /// [`RunStore::list`](crate::RunStore::list).
    pub(super) async fn list_runs(
        &self,
        status: Option<RunStatus>,
        n: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let q = match status {
            Some(s) => sqlx::query_as(&self.q.list_status)
                .bind(s.as_str())
                .bind(limit(n)),
            None => sqlx::query_as(&self.q.list_all).bind(limit(n)),
        };
        q.fetch_all(&self.pool)
            .await
            .map_err(rows_error("list runs"))
    }

    /// [`RunStore::page`](crate::RunStore::page) in one indexed statement.
    pub(super) async fn select_page(&self, q: &RunPageQuery) -> Result<Vec<Run>, StoreError> {
        let mut query = sqlx::query_as::<DB, Run>(self.pages.statement(q));
        if let Some(agent) = q.agent.as_deref() {
            query = query.bind(agent);
        }
        if let PageFrom::Before(c) | PageFrom::After(c) = q.from {
            query = query
                .bind(c.created_at)
                .bind(c.created_at)
                .bind(DB::id(c.id));
        }
        let mut runs = query
            .bind(i64::try_from(q.limit).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(rows_error("page runs"))?;
        if let PageFrom::After(_) = q.from {
            runs.reverse();
        }
        Ok(runs)
    }

    /// [`RunStore::count_by_status`](crate::RunStore::count_by_status) in one `GROUP BY`.
    pub(super) async fn status_counts(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        let rows = sqlx::query(&self.pages.count_by_status)
            .fetch_all(self.pool())
            .await
            .map_err(super::db("count runs"))?;
        let mut counts = Vec::new();
        for row in &rows {
            let status: String = column(row, "status")?;
            let n: i64 = column(row, "n")?;
            let status: RunStatus = status
                .parse()
                .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
            counts.push((status, u64::try_from(n).unwrap_or(0)));
        }
        // In RunStatus::ALL order, like the other stores.
        let mut ordered = Vec::with_capacity(counts.len());
        for status in RunStatus::ALL {
            if let Some((_, n)) = counts.iter().find(|(s, _)| *s == status) {
                ordered.push((status, *n));
            }
        }
        Ok(ordered)
    }
}
