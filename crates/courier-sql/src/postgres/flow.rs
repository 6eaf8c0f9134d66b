//! PostgreSQL: a flow-control claim in one round trip.
//!
//! A claim of a queue with flow control per key must count the slots the claims before it
//! took, so it runs under the queue's claim lock (a transaction-scoped advisory lock) on a
//! snapshot taken after the lock was granted. As an explicit transaction that is four round
//! trips (`BEGIN`, the acks of the last batch with the lock, the claim, `COMMIT`). Here it is
//! one: a simple query of two statements, which PostgreSQL runs as one implicit transaction,
//! each statement on a snapshot of its own (READ COMMITTED), so the claim sees every claim
//! committed before the lock was granted, as in the explicit transaction. Both statements are
//! prepared once per session (`PREPARE`, by a name derived from their text) and executed by
//! name, so the claim keeps its generic plan (`plan_cache_mode` in the claim's settings); rows
//! come back as text, the one cost of the simple protocol.

use futures_util::TryStreamExt as _;
use sqlx::Either;
use sqlx::postgres::{PgConnection, PgRow};

use crate::backend::{StoredRow, sort_claimed};
use crate::messages::Messages;

/// A statement prepared under a name of its own: `PREPARE <name> (<types>) AS <sql>`.
struct Prepared<'a> {
    name: String,
    types: &'static str,
    sql: &'a str,
}

impl<'a> Prepared<'a> {
    fn new(types: &'static str, sql: &'a str) -> Self {
        // FNV-1a over the text: a name per statement (and so per table, queue limit and
        // version of Courier), never one another statement's.
        let hash = sql.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Self {
            name: format!("courier_{hash:016x}"),
            types,
            sql,
        }
    }

    fn execute(&self, args: &[String]) -> String {
        format!("EXECUTE {} ({})", self.name, args.join(", "))
    }

    fn prepare(&self) -> String {
        format!("PREPARE {} ({}) AS {}", self.name, self.types, self.sql)
    }
}

/// A string as a PostgreSQL literal (`E'...'`, whatever `standard_conforming_strings` says).
fn literal(value: &str) -> Result<String, sqlx::Error> {
    if value.contains('\0') {
        return Err(sqlx::Error::Protocol(format!(
            "{value:?} holds a NUL character, which PostgreSQL text cannot"
        )));
    }
    Ok(format!(
        "E'{}'",
        value.replace('\\', "\\\\").replace('\'', "''")
    ))
}

/// Integers as a PostgreSQL `int8[]` literal.
fn array(values: impl Iterator<Item = i64>) -> String {
    let items: Vec<String> = values.map(|v| v.to_string()).collect();
    format!("'{{{}}}'::int8[]", items.join(","))
}

/// Deletes `deliveries` (the acks of the last batch) and claims up to `max` rows of a queue with
/// flow control, under the queue's claim lock; see the module docs. A head claim that gives
/// fewer than asked is followed by the whole claim for the rest, as a claim of its own.
pub(crate) async fn claim(
    m: &Messages<sqlx::Postgres>,
    deliveries: &[(i64, i64)],
    max: usize,
    delivery_id: i64,
) -> Option<Result<Vec<StoredRow>, sqlx::Error>> {
    let flow = m.flow.as_ref()?;
    let settle = flow.settle.as_deref()?;
    let lock = flow.lock.as_deref()?;
    Some(claim_under_lock(m, settle, lock, deliveries, max, delivery_id).await)
}

async fn claim_under_lock(
    m: &Messages<sqlx::Postgres>,
    settle: &str,
    lock: &str,
    deliveries: &[(i64, i64)],
    max: usize,
    delivery_id: i64,
) -> Result<Vec<StoredRow>, sqlx::Error> {
    let Some(flow) = m.flow.as_ref() else {
        return Ok(Vec::new());
    };
    let mut conn = m.writes().acquire().await?;
    let lock_name = literal(&flow.lock_name)?;
    let queue = literal(&m.queue)?;
    let (mut before, mut before_args) = (Prepared::new("text", lock), vec![lock_name.clone()]);
    if !deliveries.is_empty() {
        before_args = vec![
            array(deliveries.iter().map(|d| d.0)),
            array(deliveries.iter().map(|d| d.1)),
            lock_name.clone(),
        ];
        let types = if flow.notify.is_some() {
            before_args.extend([literal(&m.table)?, literal(&m.queue)?]);
            "int8[], int8[], text, text, text"
        } else {
            "int8[], int8[], text"
        };
        before = Prepared::new(types, settle);
    }
    // The head claim, then, if it found fewer than asked in a head it filled (full keys hold
    // part of it), the whole claim for the rest.
    let head = flow.head_claim(max);
    let claims: Vec<&str> = head
        .map(|(_, sql)| sql)
        .into_iter()
        .chain([flow.claim.as_str()])
        .collect();
    let mut rows = Vec::new();
    for claim in claims {
        let claim = Prepared::new("text, int8, int8, int8", claim);
        let claim_args = vec![
            queue.clone(),
            m.redeliver_ms.to_string(),
            (max - rows.len()).to_string(),
            delivery_id.to_string(),
        ];
        let (more, seen) = run(&mut conn, &before, &before_args, &claim, &claim_args).await?;
        rows.extend(more);
        let whole_head_seen = matches!((head, seen), (Some((size, _)), Some(seen))
            if usize::try_from(seen).is_ok_and(|seen| seen < size));
        if rows.len() >= max || whole_head_seen {
            break;
        }
        // The acks are settled: the whole claim for the rest takes the lock alone.
        (before, before_args) = (Prepared::new("text", lock), vec![lock_name.clone()]);
    }
    sort_claimed(&mut rows);
    Ok(rows)
}

/// Runs `before` then `claim` as one simple query and returns the claim's rows and, from a head
/// claim, the rows its head held; a statement this session has not prepared is prepared, and
/// the query run again.
async fn run(
    conn: &mut PgConnection,
    before: &Prepared<'_>,
    before_args: &[String],
    claim: &Prepared<'_>,
    claim_args: &[String],
) -> Result<Claimed, sqlx::Error> {
    let sql = format!(
        "{}; {}",
        before.execute(before_args),
        claim.execute(claim_args)
    );
    match claimed(conn, &sql).await {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_STATEMENT) => {
            for statement in [before, claim] {
                match prepare(conn, &statement.prepare()).await {
                    Err(sqlx::Error::Database(e))
                        if e.code().as_deref() == Some(DUPLICATE_STATEMENT) => {}
                    done => {
                        done?;
                    }
                }
            }
            claimed(conn, &sql).await
        }
        done => done,
    }
}

/// `invalid_sql_statement_name`: `EXECUTE` of a name this session has not prepared.
const UNDEFINED_STATEMENT: &str = "26000";
/// `duplicate_prepared_statement`: `PREPARE` of a name this session has prepared.
const DUPLICATE_STATEMENT: &str = "42P05";

/// Runs `PREPARE` (boxed, as [`claimed`]).
fn prepare<'c>(
    conn: &'c mut PgConnection,
    sql: &'c str,
) -> futures_util::future::BoxFuture<'c, Result<(), sqlx::Error>> {
    Box::pin(async move { sqlx::Executor::execute(conn, sql).await.map(drop) })
}

/// The rows a claim took, and the rows its head held (a head claim's `seen`).
type Claimed = (Vec<StoredRow>, Option<i64>);

/// The rows of the second statement of `sql` (boxed: the stream's future is `Send` for the
/// lifetimes at hand, which the compiler cannot prove of it unboxed inside `async_trait`).
fn claimed<'c>(
    conn: &'c mut PgConnection,
    sql: &'c str,
) -> futures_util::future::BoxFuture<'c, Result<Claimed, sqlx::Error>> {
    Box::pin(async move {
        use sqlx::Row as _;
        // A `&str` without arguments goes as a simple query.
        let mut results = sqlx::Executor::fetch_many(conn, sql);
        let mut statement = 0;
        let (mut rows, mut seen) = (Vec::new(), None);
        while let Some(item) = results.try_next().await? {
            match item {
                Either::Left(_) => statement += 1,
                Either::Right(row) if statement == 1 => {
                    // A head claim's rows carry `seen`; when it claims none, one row of NULLs does.
                    seen = seen.or(row.try_get::<Option<i64>, _>("seen").ok().flatten());
                    if row.try_get::<Option<i64>, _>("id")?.is_some() {
                        rows.push(<StoredRow as sqlx::FromRow<'_, PgRow>>::from_row(&row)?);
                    }
                }
                Either::Right(_) => {}
            }
        }
        Ok((rows, seen))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_keeps_quotes_and_backslashes_and_refuses_nul() {
        assert_eq!(literal("it's a\\b").expect("a literal"), r"E'it''s a\\b'");
        assert!(literal("a\0b").is_err());
        assert_eq!(array([1, -2, 3].into_iter()), "'{1,-2,3}'::int8[]");
    }

    #[test]
    fn a_statement_is_named_after_its_text() {
        let a = Prepared::new("text", "SELECT $1");
        assert_eq!(a.name, Prepared::new("int8", "SELECT $1").name);
        assert_ne!(a.name, Prepared::new("text", "SELECT $1 ").name);
        assert_eq!(a.name.len(), "courier_".len() + 16);
        assert_eq!(
            a.execute(&["E'x'".into()]),
            format!("EXECUTE {} (E'x')", a.name)
        );
        assert_eq!(
            a.prepare(),
            format!("PREPARE {} (text) AS SELECT $1", a.name)
        );
    }
}
