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
//! come back as text, the one cost of the simple protocol. A session that has not prepared
//! them (a new one, or a server session a pooler handed this transaction) runs that claim as
//! the explicit transaction instead, and prepares them for the next.

use futures_util::TryStreamExt as _;
use sqlx::Either;
use sqlx::postgres::{PgConnection, PgRow};

use crate::backend::{StoredRow, sort_claimed};
use crate::messages::Messages;
use crate::messages::flow::FlowStatements;

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
    Some(claim_under_lock(m, flow, settle, lock, deliveries, max, delivery_id).await)
}

async fn claim_under_lock(
    m: &Messages<sqlx::Postgres>,
    flow: &FlowStatements,
    settle: &str,
    lock: &str,
    deliveries: &[(i64, i64)],
    max: usize,
    delivery_id: i64,
) -> Result<Vec<StoredRow>, sqlx::Error> {
    let mut conn = m.writes().acquire().await?;
    // The claim's settings and lock alone: before a claim with no acks to settle, and before
    // the whole claim that follows a head claim (the acks went with the head claim).
    let lock_only = || Before {
        sql: lock,
        types: "text",
        acks: None,
        lock: flow.lock_name.clone(),
        notify: None,
    };
    let mut before = lock_only();
    if !deliveries.is_empty() {
        let notify = flow
            .notify
            .is_some()
            .then(|| (m.table.clone(), m.queue.clone()));
        before = Before {
            sql: settle,
            types: if notify.is_some() {
                "int8[], int8[], text, text, text"
            } else {
                "int8[], int8[], text"
            },
            acks: Some(deliveries.iter().copied().unzip()),
            lock: flow.lock_name.clone(),
            notify,
        };
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
    for sql in claims {
        let claim = Claim {
            sql,
            queue: m.queue.clone(),
            window: m.redeliver_ms,
            limit: i64::try_from(max - rows.len()).unwrap_or(i64::MAX),
            delivery_id,
        };
        let (more, seen) = run(&mut conn, &before, &claim).await?;
        rows.extend(more);
        let whole_head_seen = matches!((head, seen), (Some((size, _)), Some(seen))
            if usize::try_from(seen).is_ok_and(|seen| seen < size));
        if rows.len() >= max || whole_head_seen {
            break;
        }
        before = lock_only();
    }
    sort_claimed(&mut rows);
    Ok(rows)
}

/// The statement before a claim: the acks' `DELETE` with the claim's settings and lock (and,
/// limited, the `NOTIFY`), or the settings and lock alone.
struct Before<'a> {
    sql: &'a str,
    types: &'static str,
    /// The acks' row ids and delivery ids.
    acks: Option<(Vec<i64>, Vec<i64>)>,
    /// The claim lock's name.
    lock: String,
    /// The channel and payload of the wake-up.
    notify: Option<(String, String)>,
}

impl Before<'_> {
    fn literals(&self) -> Result<Vec<String>, sqlx::Error> {
        let mut args = Vec::with_capacity(5);
        if let Some((ids, tags)) = &self.acks {
            args.extend([array(ids.iter().copied()), array(tags.iter().copied())]);
        }
        args.push(literal(&self.lock)?);
        if let Some((channel, queue)) = &self.notify {
            args.extend([literal(channel)?, literal(queue)?]);
        }
        Ok(args)
    }
}

/// A claim statement and its values.
struct Claim<'a> {
    sql: &'a str,
    queue: String,
    window: i64,
    limit: i64,
    delivery_id: i64,
}

impl Claim<'_> {
    fn literals(&self) -> Result<Vec<String>, sqlx::Error> {
        Ok(vec![
            literal(&self.queue)?,
            self.window.to_string(),
            self.limit.to_string(),
            self.delivery_id.to_string(),
        ])
    }
}

/// Runs `before` then `claim` as one simple query and returns the claim's rows and, from a head
/// claim, the rows its head held. On a session without the statements prepared (a new one, or
/// behind a pooler that hands each transaction a server session of its own), this claim runs
/// as an explicit transaction of bound statements instead, which works wherever a transaction
/// does, and the statements are prepared for the next claim on this session.
async fn run(
    conn: &mut PgConnection,
    before: &Before<'_>,
    claim: &Claim<'_>,
) -> Result<Claimed, sqlx::Error> {
    let (first, second) = (
        Prepared::new(before.types, before.sql),
        Prepared::new("text, int8, int8, int8", claim.sql),
    );
    let sql = format!(
        "{}; {}",
        first.execute(&before.literals()?),
        second.execute(&claim.literals()?)
    );
    match claimed(conn, &sql).await {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_STATEMENT) => {
            for statement in [&first, &second] {
                match prepare(conn, &statement.prepare()).await {
                    Err(sqlx::Error::Database(e))
                        if e.code().as_deref() == Some(DUPLICATE_STATEMENT) => {}
                    done => {
                        done?;
                    }
                }
            }
            in_transaction(conn, before, claim).await
        }
        done => done,
    }
}

/// `before` then `claim`, bound, in an explicit transaction (boxed, as [`claimed`]).
fn in_transaction<'c>(
    conn: &'c mut PgConnection,
    before: &'c Before<'_>,
    claim: &'c Claim<'_>,
) -> futures_util::future::BoxFuture<'c, Result<Claimed, sqlx::Error>> {
    Box::pin(async move {
        let mut tx = sqlx::Connection::begin(conn).await?;
        let mut first = sqlx::query(before.sql);
        if let Some((ids, tags)) = &before.acks {
            first = first.bind(ids).bind(tags);
        }
        first = first.bind(&before.lock);
        if let Some((channel, queue)) = &before.notify {
            first = first.bind(channel).bind(queue);
        }
        first.execute(&mut *tx).await?;
        let got = sqlx::query(claim.sql)
            .bind(&claim.queue)
            .bind(claim.window)
            .bind(claim.limit)
            .bind(claim.delivery_id)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut taken = (Vec::new(), None);
        for row in &got {
            take(row, &mut taken)?;
        }
        Ok(taken)
    })
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
        // A `&str` without arguments goes as a simple query.
        let mut results = sqlx::Executor::fetch_many(conn, sql);
        let mut statement = 0;
        let mut taken = (Vec::new(), None);
        while let Some(item) = results.try_next().await? {
            match item {
                Either::Left(_) => statement += 1,
                Either::Right(row) if statement == 1 => take(&row, &mut taken)?,
                Either::Right(_) => {}
            }
        }
        Ok(taken)
    })
}

/// A claim's row into `taken`: a head claim's rows carry `seen`, and when it claims none, one
/// row of NULLs does.
fn take(row: &PgRow, taken: &mut Claimed) -> Result<(), sqlx::Error> {
    use sqlx::Row as _;
    taken.1 = taken
        .1
        .or(row.try_get::<Option<i64>, _>("seen").ok().flatten());
    if row.try_get::<Option<i64>, _>("id")?.is_some() {
        taken
            .0
            .push(<StoredRow as sqlx::FromRow<'_, PgRow>>::from_row(row)?);
    }
    Ok(())
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
