//! The statements of a queue with flow control per key.

use super::COLUMNS;
use crate::Dialect;

/// The statements of a queue with flow control per key (`concurrency_max`, `fair`): rows carry
/// a `concurrency_key`, and the claim ranks the claimable rows per key with a window function.
/// A slot is a delivered row under a live lease (`delivered_at` within the redelivery window):
/// nothing else holds it, so an ack, a retry or an expired lease frees it and none can leak.
#[derive(Debug)]
pub(crate) struct FlowStatements {
    /// SQLite and PostgreSQL: claims in one statement (binds: queue, redelivery window, limit,
    /// delivery id). MySQL: the select of the rows to claim (binds: queue, window, queue,
    /// window, limit); the update follows as in the plain claim.
    pub(crate) claim: String,
    /// A limited queue without `fair`: the same claim ranking only the FIFO head of the
    /// queue, tried first, per head size (rows ranked), smallest first; see
    /// [`Self::head_claim`]. A key's rows in the head are its first rows, so their ranks are
    /// exact; when it claims fewer than asked (the head is taken by full keys, or is all there
    /// is), the whole claim runs for the rest, in the same transaction.
    head_claims: Vec<(usize, String)>,
    /// Serialises the claims of the queue across hosts: PostgreSQL, a transaction-scoped
    /// advisory lock (bind: the lock's name); MySQL, a named lock of the session (binds: name,
    /// timeout in seconds). SQLite: `None` (its write lock serialises).
    pub(crate) lock: Option<String>,
    /// MySQL: releases the named lock (bind: name).
    pub(crate) unlock: Option<String>,
    /// PostgreSQL: the acks of the last batch, the claim's settings and lock, and (limited)
    /// the wake-up of waiting consumers, in one statement (binds: ids, delivery ids, the lock's
    /// name, then, limited, channel and queue). It notifies only when a row was deleted.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL dialect only")
    )]
    pub(crate) settle: Option<String>,
    /// The name of the queue's claim lock.
    pub(crate) lock_name: String,
    /// The next due time, leaving out waiting rows of full keys (binds: window, queue, queue,
    /// window); without a limit, the plain statement's.
    pub(crate) next_due: Option<String>,
    /// PostgreSQL: wakes the queue's waiting consumers after an ack freed a slot (binds:
    /// channel, queue).
    pub(crate) notify: Option<String>,
    /// Each key's rows in flight (delivered under a live lease) and queued (ready to deliver,
    /// not under a live lease) (binds: window, window, queue).
    pub(crate) loads: String,
}

/// PostgreSQL: the planner settings of a flow-control claim's transaction (see
/// [`FlowStatements::lock`]). JIT compilation is off: the claim ranking the whole queue, planned
/// generic over a table whose statistics count 250,000 rows (live and dead), is estimated above
/// `jit_above_cost`, and each execution compiled it anew: 18-28 ms of JIT for 2 ms of work, on
/// every claim that found fewer rows than asked (an idle worker's, each time a message came).
const PG_CLAIM_SETTINGS: &str = "set_config('enable_sort', 'on', true), \
     set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), \
     set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true)";

/// The most rows of a queue's FIFO head that a head claim ranks.
const HEAD_ROWS: usize = 1_000;

/// PostgreSQL: the head sizes; a claim ranks the smallest head of at least the rows it asks for
/// (a few sizes, rather than the rows asked for, so that a generic plan serves them). A head
/// that full keys hold in part gives fewer rows than asked, and the whole claim then takes the
/// rest. `courier bench` (fetch 64, 100 keys, at most 10 each, 20,000 messages): 11.3-11.6k
/// msg/s ranking 1,000 rows, 17.5-17.6k ranking 256, 18.4-19.0k ranking 128; later, on another
/// machine, 25.6-26.8k ranking 128 and 27.5-28.0k ranking 64 (0.72-0.76x and 0.77-0.82x of the
/// same queue without keys).
const PG_HEADS: [usize; 5] = [64, 128, 256, 512, HEAD_ROWS];

impl FlowStatements {
    /// The head claim to try first for a claim of `asked` rows, and the rows it ranks (None:
    /// fair, or not limited).
    pub(crate) fn head_claim(&self, asked: usize) -> Option<(usize, &str)> {
        self.head_claims
            .iter()
            .find(|(rows, _)| *rows >= asked)
            .or(self.head_claims.last())
            .map(|(rows, sql)| (*rows, sql.as_str()))
    }
}

impl FlowStatements {
    pub(crate) fn new(dialect: Dialect, t: &str, max: Option<u32>, fair: bool) -> Self {
        let r = |template: String| dialect.render(&template);
        let claimable = "queue_name = ? AND available_at <= {now}                          AND (delivered_at IS NULL OR delivered_at < {now} - ?)";
        // The key's n-th claimable row (FIFO inside a key), and how many of its rows are
        // delivered under a live lease: a row may be claimed while n + busy <= max.
        let full = max.map_or(String::new(), |max| {
            format!(" WHERE (r.concurrency_key IS NULL OR r.rn + COALESCE(b.busy, 0) <= {max})")
        });
        let busy_join = if max.is_some() {
            format!(
                " LEFT JOIN (SELECT concurrency_key, COUNT(*) AS busy FROM {t}                  WHERE queue_name = ? AND concurrency_key IS NOT NULL AND delivered_at >= {{now}} - ?                  GROUP BY concurrency_key) b ON b.concurrency_key = r.concurrency_key"
            )
        } else {
            String::new()
        };
        let order = if fair {
            "r.priority DESC, r.rn, r.available_at, r.id"
        } else {
            "r.priority DESC, r.available_at, r.id"
        };
        let pick_from = |busy_join: &str, rows: &str| {
            format!(
                "SELECT r.id FROM (SELECT id, priority, available_at, concurrency_key,                  ROW_NUMBER() OVER (PARTITION BY concurrency_key ORDER BY priority DESC, available_at, id) AS rn                  FROM {rows}) r{busy_join}{full} ORDER BY {order} LIMIT ?"
            )
        };
        let whole = format!("{t} WHERE {claimable}");
        let head = format!(
            "(SELECT id, priority, available_at, concurrency_key FROM {t} WHERE {claimable}              ORDER BY priority DESC, available_at, id LIMIT {HEAD_ROWS}) h"
        );
        let pick = |busy_join: &str| pick_from(busy_join, &whole);
        // SQLite numbers its binds, so the busy count reuses the queue and the window;
        // PostgreSQL's are written out; MySQL binds them again.
        let numbered = |sql: String, marks: &[&str]| {
            let mut out = String::with_capacity(sql.len());
            let mut n = 0;
            for c in sql.chars() {
                if c == '?' {
                    out.push_str(marks.get(n).copied().unwrap_or("?"));
                    n += 1;
                } else {
                    out.push(c);
                }
            }
            out
        };
        let claim_with = |pick: &dyn Fn(&str) -> String| match dialect {
            Dialect::Sqlite => {
                let marks: &[&str] = if max.is_some() {
                    &["?1", "?2", "?1", "?2", "?3"]
                } else {
                    &["?1", "?2", "?3"]
                };
                r(format!(
                    "UPDATE {t} SET delivered_at = {{now}}, delivery_id = ?4 WHERE id IN ({})                      RETURNING {COLUMNS}",
                    numbered(pick(&busy_join), marks)
                ))
            }
            Dialect::Postgres => {
                let marks: &[&str] = if max.is_some() {
                    &["$1", "$2", "$1", "$2", "$3"]
                } else {
                    &["$1", "$2", "$3"]
                };
                // Under the queue's claim lock, so no other claim counts the same slots; the
                // update checks each row is still claimable (a claim without the lock, of
                // another version, may have taken it).
                r(format!(
                    "WITH picked AS (SELECT ARRAY({}) AS ids)                      UPDATE {t} SET delivered_at = {{now}}, delivery_id = $4 FROM picked                      WHERE {t}.id = ANY(picked.ids) AND ({t}.delivered_at IS NULL OR {t}.delivered_at < {{now}} - $2)                      RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at",
                    numbered(pick(&busy_join), marks)
                ))
            }
            Dialect::Mysql => r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE id IN (SELECT id FROM ({}) p)",
                pick(&busy_join)
            )),
        };
        let claim = claim_with(&pick);
        let head_claims = match (max, dialect) {
            (Some(_), _) if fair => Vec::new(),
            // PostgreSQL ranks the head's rows per key together with the rows in flight (one
            // range of the in-flight index, migration 0013), each key's delivered rows first: a
            // head row may go while its rank is at most `max`. The start of that range,
            // `(SELECT now - window)`, is computed once (a bound of the index range; written
            // inline it is a filter over every delivered row). Before, a subquery per key of the
            // head sought that key's range of the whole queue's index and a join added the
            // counts: 100 keys, 0.45 ms of the claim where this takes 0.05 ms, and no join whose
            // plan depends on the statistics. It returns how many rows the head held (`seen`, on
            // every row, and on a row of NULLs when it claims none): a head of fewer rows than
            // its size was the whole queue's claimable rows, so no claim of the whole queue can
            // find more. The claim's transaction plans it once
            // (`force_generic_plan` in its settings): the plan is the same every time, and a
            // custom plan cost 0.3 ms of planning per claim.
            (Some(max), Dialect::Postgres) => PG_HEADS.map(|head| (head, r(format!(
                "WITH h AS (SELECT id, priority, available_at, concurrency_key FROM {t} \
                 WHERE queue_name = $1 AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - $2) \
                 ORDER BY priority DESC, available_at, id LIMIT {head}), \
                 picked AS (SELECT ARRAY(SELECT r.id FROM (SELECT u.*, ROW_NUMBER() OVER \
                 (PARTITION BY concurrency_key ORDER BY busy DESC, priority DESC, available_at, id) AS rn \
                 FROM (SELECT id, priority, available_at, concurrency_key, 0 AS busy FROM h UNION ALL \
                 SELECT NULL, 0, 0, concurrency_key, 1 FROM {t} WHERE queue_name = $1 \
                 AND delivered_at IS NOT NULL AND concurrency_key IS NOT NULL \
                 AND delivered_at >= (SELECT {{now}} - $2)) u) r \
                 WHERE r.busy = 0 AND (r.concurrency_key IS NULL OR r.rn <= {max}) \
                 ORDER BY r.priority DESC, r.available_at, r.id LIMIT $3) AS ids) \
                 , claimed AS (UPDATE {t} SET delivered_at = {{now}}, delivery_id = $4 FROM picked \
                 WHERE {t}.id = ANY(picked.ids) AND ({t}.delivered_at IS NULL OR {t}.delivered_at < {{now}} - $2) \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at) \
                 SELECT c.*, (SELECT COUNT(*) FROM h) AS seen FROM (SELECT 1) one LEFT JOIN claimed c ON true"
            ))))
            .into(),
            (Some(_), _) => vec![(
                HEAD_ROWS,
                claim_with(&|busy_join: &str| pick_from(busy_join, &head)),
            )],
            (None, _) => Vec::new(),
        };
        let (lock, unlock) = match dialect {
            Dialect::Sqlite => (None, None),
            Dialect::Postgres => (
                // The transport's sessions plan with `enable_sort = off` (its plain statements
                // walk indexes); ranking per key sorts, so this transaction turns it back on,
                // and turns off the scans that would read the whole queue to sort it: with
                // statistics taken while the queue was empty (autovacuum's), the planner
                // otherwise reads every row of a 20,000-row backlog (a bitmap scan and a sort,
                // 15 ms) where the claim index gives the head in order (1 ms).
                Some(format!(
                    "SELECT {PG_CLAIM_SETTINGS}, pg_advisory_xact_lock(hashtext($1))"
                )),
                None,
            ),
            Dialect::Mysql => (
                Some("SELECT GET_LOCK(?, ?)".to_owned()),
                Some("SELECT RELEASE_LOCK(?)".to_owned()),
            ),
        };
        let settle = (dialect == Dialect::Postgres).then(|| {
            let notify = if max.is_some() {
                ", (SELECT pg_notify($4, $5) FROM gone LIMIT 1)"
            } else {
                ""
            };
            format!(
                "WITH gone AS (DELETE FROM {t} WHERE (id, delivery_id) IN \
                 (SELECT * FROM UNNEST($1::INT8[], $2::INT8[])) RETURNING 1) \
                 SELECT {PG_CLAIM_SETTINGS}, pg_advisory_xact_lock(hashtext($3)){notify}"
            )
        });
        let next_due = max.map(|max| {
            r(format!(
                "SELECT CAST(MIN(CASE WHEN delivered_at IS NULL THEN available_at                  ELSE {{greatest}}(available_at, delivered_at + ?) END) - {{now}} AS {{bigint}})                  FROM {t} WHERE queue_name = ? AND (delivered_at IS NOT NULL OR concurrency_key IS NULL                  OR concurrency_key NOT IN (SELECT concurrency_key FROM {t} WHERE queue_name = ?                  AND concurrency_key IS NOT NULL AND delivered_at >= {{now}} - ?                  GROUP BY concurrency_key HAVING COUNT(*) >= {max}))"
            ))
        });
        Self {
            claim,
            head_claims,
            lock,
            unlock,
            settle,
            // MySQL lock names are at most 64 characters (a table name is at most 46).
            lock_name: format!("courier_claim:{t}"),
            next_due,
            notify: (dialect == Dialect::Postgres && max.is_some())
                .then(|| "SELECT pg_notify($1, $2)".to_owned()),
            loads: r(format!(
                "SELECT {key}, COUNT(CASE WHEN delivered_at >= {{now}} - ? THEN 1 END), \
                 COUNT(CASE WHEN available_at <= {{now}} AND (delivered_at IS NULL \
                 OR delivered_at < {{now}} - ?) THEN 1 END) \
                 FROM {t} WHERE queue_name = ? AND concurrency_key IS NOT NULL \
                 GROUP BY concurrency_key",
                // MySQL keeps the key as bytes (VARBINARY): read it back as text.
                key = if dialect == Dialect::Mysql {
                    "CAST(concurrency_key AS CHAR)"
                } else {
                    "concurrency_key"
                }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_head_claim_ranks_the_smallest_head_that_holds_the_rows_asked_for() {
        let flow = FlowStatements::new(Dialect::Postgres, "t", Some(10), false);
        for (asked, head) in [
            (1, 64),
            (64, 64),
            (65, 128),
            (200, 256),
            (1000, 1000),
            (5000, 1000),
        ] {
            let (rows, sql) = flow.head_claim(asked).expect("a head claim");
            assert_eq!(rows, head);
            assert!(
                sql.contains(&format!("id LIMIT {head}), picked")),
                "{asked} rows asked: {sql}"
            );
        }
        let fair = FlowStatements::new(Dialect::Postgres, "t", Some(10), true);
        assert!(
            fair.head_claim(64).is_none(),
            "a fair claim ranks the whole queue"
        );
    }

    /// A limited queue's head claim, planned as its transaction plans it (once, generic, with
    /// the claim's settings), on a table whose statistics say it is empty (the plan a fresh
    /// table gets) and after an `ANALYZE`: it reads the head by the claim index and the rows in
    /// flight by the in-flight index, and never scans the table. (Before migration 0013 the
    /// busy count read the whole queue's concurrency index, one range per key.)
    #[cfg(feature = "postgres")]
    #[tokio::test]
    #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    async fn a_limited_postgres_claim_reads_the_head_and_the_rows_in_flight_by_index() {
        let (pool, table) =
            crate::messages::statements::tests::postgres_table("courier_flow_plan").await;
        // 20,000 queued over 100 keys, the first 640 delivered.
        sqlx::query(&format!(
            "INSERT INTO {table} (queue_name, body, headers, created_at, available_at, \
             concurrency_key, delivered_at, delivery_id) \
             SELECT 'default', repeat('x', 200), '{{}}', 1, g, 'key-' || (g % 100), \
             CASE WHEN g <= 640 THEN CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) END, \
             CASE WHEN g <= 640 THEN 1 END FROM generate_series(1, 20000) g"
        ))
        .execute(&pool)
        .await
        .expect("the backlog");
        let flow = FlowStatements::new(Dialect::Postgres, &table, Some(10), false);
        let (_, head) = flow
            .head_claim(64)
            .expect("a limited queue has head claims");
        let lock = flow.lock.as_deref().expect("a claim lock");
        let mut failures = Vec::new();
        for analyzed in [false, true] {
            let mut conn = pool.acquire().await.expect("a session");
            if analyzed {
                sqlx::query(&format!("ANALYZE {table}"))
                    .execute(&mut *conn)
                    .await
                    .expect("analyze");
            }
            sqlx::query("BEGIN")
                .execute(&mut *conn)
                .await
                .expect("begin");
            sqlx::query(lock)
                .bind("plan")
                .execute(&mut *conn)
                .await
                .expect("the claim's settings");
            sqlx::raw_sql(&format!(
                "PREPARE head_claim(TEXT, BIGINT, BIGINT, BIGINT) AS {head}"
            ))
            .execute(&mut *conn)
            .await
            .expect("prepare");
            let plan: Vec<String> =
                sqlx::query_scalar("EXPLAIN EXECUTE head_claim('default', 3600000, 64, 8)")
                    .fetch_all(&mut *conn)
                    .await
                    .expect("explain");
            let plan = plan.join("\n");
            sqlx::raw_sql("ROLLBACK; DEALLOCATE head_claim")
                .execute(&mut *conn)
                .await
                .expect("rollback");
            if plan.contains("Seq Scan")
                || plan.contains("Bitmap")
                || !plan.contains(&format!("{table}_claim_idx"))
                || !plan.contains(&format!("{table}_inflight_idx"))
                // Generic: the queue is a parameter, not the value bound.
                || !plan.contains("$1")
            {
                failures.push(format!("analyzed: {analyzed}:\n{plan}"));
            }
        }
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_cursors"))
            .execute(&pool)
            .await;
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// No statement of a keyed claim's transaction is JIT-compiled, however low the session's
    /// `jit_above_cost`: the claim ranking the whole queue, planned generic over a table whose
    /// statistics count many rows, was estimated above the default threshold and compiled anew
    /// at each execution (18-28 ms, for 2 ms of work, on every claim of an idle worker). The
    /// session here lowers the threshold to 0, so every plan qualifies.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    async fn a_postgres_claim_is_never_jit_compiled() {
        let (pool, table) =
            crate::messages::statements::tests::postgres_table("courier_flow_jit").await;
        sqlx::query(&format!(
            "INSERT INTO {table} (queue_name, body, headers, created_at, available_at, \
             concurrency_key) SELECT 'default', 'x', '{{}}', 1, g, 'key-' || (g % 10) \
             FROM generate_series(1, 100) g"
        ))
        .execute(&pool)
        .await
        .expect("the backlog");
        let flow = FlowStatements::new(Dialect::Postgres, &table, Some(3), false);
        let (_, head) = flow
            .head_claim(64)
            .expect("a limited queue has head claims");
        let lock = flow.lock.as_deref().expect("a claim lock");
        let settle = flow.settle.as_deref().expect("a settle statement");
        let mut conn = pool.acquire().await.expect("a session");
        let jit: bool = sqlx::query_scalar("SELECT pg_jit_available()")
            .fetch_one(&mut *conn)
            .await
            .expect("jit available");
        let mut plans = Vec::new();
        for first in [lock, settle] {
            sqlx::raw_sql("SET jit_above_cost = 0; BEGIN")
                .execute(&mut *conn)
                .await
                .expect("begin");
            let q = sqlx::query(first);
            let q = if first == settle {
                q.bind(vec![0_i64])
                    .bind(vec![0_i64])
                    .bind("jit")
                    .bind(&table)
                    .bind("default")
            } else {
                q.bind("jit")
            };
            q.execute(&mut *conn).await.expect("the claim's settings");
            for claim in [head, flow.claim.as_str()] {
                let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN ANALYZE {claim}"))
                    .bind("default")
                    .bind(30_000_i64)
                    .bind(64_i64)
                    .bind(7_i64)
                    .fetch_all(&mut *conn)
                    .await
                    .expect("explain");
                plans.push(plan.join("\n"));
            }
            sqlx::raw_sql("ROLLBACK; RESET jit_above_cost")
                .execute(&mut *conn)
                .await
                .expect("rollback");
        }
        drop(conn);
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_cursors"))
            .execute(&pool)
            .await;
        // Without JIT in the server the test could not fail; Debian's PostgreSQL has it.
        assert!(
            jit,
            "this PostgreSQL cannot JIT-compile: the test proves nothing here"
        );
        let compiled: Vec<&String> = plans.iter().filter(|p| p.contains("JIT")).collect();
        assert!(compiled.is_empty(), "JIT-compiled claims:\n{compiled:#?}");
    }
}
