//! A run read from a row: the columns decoded without the driver's type check, and decode
//! failures back to the store's own error.

use super::{RunDialect, db};
use crate::store::{Run, StoreError};

pub(super) fn corrupt(col: &str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
    move |e| StoreError::Corrupt(format!("column `{col}`: {e}"))
}

/// A column read without the driver's type check (MySQL reports text of a binary collation as
/// bytes), decoded all the same: a value that does not decode is an error.
pub(super) fn column<'r, R, T>(row: &'r R, col: &str) -> Result<T, StoreError>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    T: sqlx::Decode<'r, R::Database>,
{
    row.try_get_unchecked(col).map_err(corrupt(col))
}

fn parsed<T: std::str::FromStr>(value: Option<String>, col: &str) -> Result<Option<T>, StoreError>
where
    T::Err: std::fmt::Display,
{
    value
        .map(|v| {
            v.parse::<T>()
                .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
        })
        .transpose()
}

impl<'r, R> sqlx::FromRow<'r, R> for Run
where
    R: sqlx::Row,
    R::Database: RunDialect,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database>,
    i64: sqlx::Decode<'r, R::Database>,
    serde_json::Value: sqlx::Decode<'r, R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        decode_run(row).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
}

pub(super) fn decode_run<'r, R>(row: &'r R) -> Result<Run, StoreError>
where
    R: sqlx::Row,
    R::Database: RunDialect,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database>,
    i64: sqlx::Decode<'r, R::Database>,
    serde_json::Value: sqlx::Decode<'r, R::Database>,
{
    let status: String = column(row, "status")?;
    let id: <R::Database as RunDialect>::Id = column(row, "id")?;
    Ok(Run {
        id: <R::Database as RunDialect>::uuid(id),
        agent: column(row, "agent")?,
        status: status
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("{e}")))?,
        input: column(row, "input")?,
        output: column(row, "output")?,
        error_class: parsed(column(row, "error_class")?, "error_class")?,
        termination_reason: parsed(column(row, "termination_reason")?, "termination_reason")?,
        claimed_by: column(row, "claimed_by")?,
        lease_expires: column(row, "lease_expires")?,
        requeue_count: u32::try_from(column::<_, i64>(row, "requeue_count")?).unwrap_or(u32::MAX),
        pending_effect: column(row, "pending_effect")?,
        created_at: column(row, "created_at")?,
        started_at: column(row, "started_at")?,
        finished_at: column(row, "finished_at")?,
        updated_at: column(row, "updated_at")?,
        due_at: column(row, "due_at")?,
        budget: column::<_, Option<serde_json::Value>>(row, "budget")?
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("column `budget`: {e}")))?,
        usage: crate::Usage {
            tokens_in: counter(row, "used_tokens_in")?,
            tokens_out: counter(row, "used_tokens_out")?,
            cost_micros: counter(row, "used_cost")?,
            tool_calls: counter(row, "used_tool_calls")?,
            turns: counter(row, "used_turns")?,
        },
        steps_replayed: counter(row, "steps_replayed")?,
        wait_signal: column(row, "wait_signal")?,
        concurrency_key: column(row, "concurrency_key")?,
        // Only a claim returns it (a missing column is "not known").
        journaled: column::<_, Option<i64>>(row, "has_steps")
            .ok()
            .flatten()
            .map(|n| n != 0),
    })
}

/// A usage counter (a BIGINT that is never negative).
fn counter<'r, R>(row: &'r R, col: &str) -> Result<u64, StoreError>
where
    R: sqlx::Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database>,
{
    Ok(u64::try_from(column::<_, i64>(row, col)?).unwrap_or(0))
}

/// A decode failure inside `FromRow` back to the store's own error.
pub(super) fn rows_error(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| match e {
        sqlx::Error::Decode(inner) => match inner.downcast::<StoreError>() {
            Ok(store) => *store,
            Err(other) => StoreError::Corrupt(other.to_string()),
        },
        e @ sqlx::Error::ColumnDecode { .. } => StoreError::Corrupt(e.to_string()),
        e => db(context)(e),
    }
}
