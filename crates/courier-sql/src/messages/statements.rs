//! The statements of a plain queue, one template each, rendered per dialect and table.

use super::COLUMNS;
use crate::Dialect;

/// The statements of one table and queue, rendered for one dialect.
#[derive(Debug)]
pub(crate) struct Statements {
    /// Claims in one statement (binds: queue, redelivery window, limit, delivery id); MySQL
    /// selects `FOR UPDATE SKIP LOCKED` with the same first three binds, then updates.
    pub(crate) claim: String,
    /// PostgreSQL: deletes acked (id, delivery id) pairs and claims, in one statement (binds:
    /// ids, delivery ids, then the claim's); elsewhere `None` (one transaction instead).
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) delete_and_claim: Option<String>,
    /// PostgreSQL: locks the rows the claim would pick `FOR UPDATE SKIP LOCKED`, in its order,
    /// and returns their ids (binds: queue, redelivery window, limit); elsewhere `None`.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) drain: Option<String>,
    /// PostgreSQL: deletes the rows [`drain`](Self::drain) locked and returns them (bind: the
    /// ids); elsewhere `None`.
    #[cfg_attr(
        not(feature = "postgres"),
        allow(dead_code, reason = "read by the PostgreSQL backend only")
    )]
    pub(crate) drain_take: Option<String>,
    pub(crate) next_due: String,
    pub(crate) delete_one: String,
    /// `DELETE ... WHERE queue_name = ? AND id IN ` (the id list follows, one bind each).
    pub(crate) delete_ids: String,
    pub(crate) keepalive: String,
    /// The head of a batch keepalive, before its deliveries predicate.
    pub(crate) keepalive_head: String,
    pub(crate) delete_head: String,
    /// Binds: headers, priority, delay, id, delivery id (PostgreSQL then channel, queue).
    pub(crate) reschedule: String,
    pub(crate) list: String,
    pub(crate) find: String,
    pub(crate) count: String,
    /// Milliseconds since the oldest row of the queue was stored (NULL when empty).
    pub(crate) oldest: String,
}

impl Statements {
    pub(super) fn new(dialect: Dialect, t: &str) -> Self {
        let r = |template: String| dialect.render(&template);
        let claim = match dialect {
            // The picked ids as one array, matched with `= ANY`: the update then always probes
            // the primary key. Joined to the ids as rows, the planner may hash the whole table
            // instead (seen with 1,000-row batches on a 60,000-row table: 27 ms, not 10 ms).
            Dialect::Postgres => format!(
                "WITH picked AS (SELECT ARRAY(SELECT id FROM {t} WHERE queue_name = ? \
                 AND available_at <= {{now}} AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                 ORDER BY priority DESC, available_at, id LIMIT ? FOR UPDATE SKIP LOCKED) AS ids) \
                 UPDATE {t} SET delivered_at = {{now}}, delivery_id = ? FROM picked WHERE {t}.id = ANY(picked.ids) \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
            ),
            // An autocommit write takes SQLite's write lock up front: no two claims overlap.
            Dialect::Sqlite => format!(
                "UPDATE {t} SET delivered_at = {{now}}, delivery_id = ?4 WHERE id IN (\
                 SELECT id FROM {t} WHERE queue_name = ?1 AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - ?2) \
                 ORDER BY priority DESC, available_at, id LIMIT ?3) RETURNING {COLUMNS}"
            ),
            Dialect::Mysql => format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                 ORDER BY priority DESC, available_at, id LIMIT ?{{skip_locked}}"
            ),
        };
        let reschedule_update = format!(
            "UPDATE {t} SET headers = ?, priority = ?, available_at = {{now}} + ?, \
             delivered_at = NULL, delivery_id = NULL WHERE id = ? AND delivery_id = ?"
        );
        let reschedule = if dialect == Dialect::Postgres {
            // The retried message wakes the queue's consumers in the same statement.
            format!(
                "WITH upd AS ({reschedule_update} RETURNING id), wake AS (SELECT pg_notify(?, ?)) \
                 SELECT COUNT(*) FROM upd CROSS JOIN wake"
            )
        } else {
            reschedule_update
        };
        Self {
            // A data-modifying CTE runs whether or not it is read: the acks and the claim go in
            // one round trip and one commit. The rows it deletes were claimed by this worker
            // within the redelivery window, so the claim (which skips those) never sees them.
            delete_and_claim: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "WITH gone AS (DELETE FROM {t} WHERE (id, delivery_id) IN \
                     (SELECT * FROM UNNEST(?::INT8[], ?::INT8[]))), {}",
                    claim.trim_start_matches("WITH ")
                ))
            }),
            claim: r(claim),
            // Two statements, so that a drain started once the first returned takes the rows
            // behind these (see `courier_core::Drain`).
            drain: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "SELECT id FROM {t} WHERE queue_name = ? \
                     AND available_at <= {{now}} AND (delivered_at IS NULL OR delivered_at < {{now}} - ?) \
                     ORDER BY priority DESC, available_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
                ))
            }),
            drain_take: (dialect == Dialect::Postgres).then(|| {
                r(format!(
                    "DELETE FROM {t} WHERE id IN (SELECT UNNEST(?::INT8[])) RETURNING {COLUMNS}"
                ))
            }),
            next_due: r(format!(
                "SELECT CAST(MIN(CASE WHEN delivered_at IS NULL THEN available_at \
                 ELSE {{greatest}}(available_at, delivered_at + ?) END) - {{now}} AS {{bigint}}) \
                 FROM {t} WHERE queue_name = ?"
            )),
            delete_one: r(format!("DELETE FROM {t} WHERE id = ? AND delivery_id = ?")),
            delete_ids: format!("DELETE FROM {t} WHERE queue_name = ? AND id IN "),
            keepalive: r(format!(
                "UPDATE {t} SET delivered_at = {{now}} WHERE id = ? AND delivery_id = ?"
            )),
            keepalive_head: r(format!("UPDATE {t} SET delivered_at = {{now}}")),
            delete_head: format!("DELETE FROM {t}"),
            reschedule: r(reschedule),
            list: r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? ORDER BY id LIMIT ?"
            )),
            find: r(format!(
                "SELECT {COLUMNS} FROM {t} WHERE queue_name = ? AND id = ?"
            )),
            count: r(format!("SELECT COUNT(*) FROM {t} WHERE queue_name = ?")),
            oldest: r(format!(
                "SELECT CAST({{now}} - MIN(created_at) AS {{bigint}}) FROM {t} WHERE queue_name = ?"
            )),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A message table of its own (named `<prefix>_<random>`, every PostgreSQL migration
    /// applied), on a pool whose sessions are set up as the transport's: for tests of plans.
    #[cfg(feature = "postgres")]
    pub(in crate::messages) async fn postgres_table(prefix: &str) -> (sqlx::PgPool, String) {
        let url = courier_test::env::postgres_url();
        let table = format!("{prefix}_{}", fastrand::u32(..));
        let options = crate::SqlOptions::default();
        let (pool, _) = crate::pool::postgres_pool(&url, &crate::PoolSettings::from(&options))
            .await
            .expect("postgres");
        let create = crate::migrate::MESSAGES
            .list
            .iter()
            .filter_map(|m| m.template(Dialect::Postgres))
            .map(|t| crate::migrate::render(t, &[("{messages}", &table)]))
            .collect::<String>();
        sqlx::raw_sql(&create)
            .execute(&pool)
            .await
            .expect("the message table");
        (pool, table)
    }

    /// With a backlog of 60,000 rows, neither a 1,000-row claim nor a 1,000-row drain reads
    /// the whole table: both walk the claim index, whether or not the table was analyzed since
    /// it filled. (Joined to the picked ids as rows, the planner hashed the whole table for each
    /// batch; before an `ANALYZE` it guessed a few rows match and sorted all 60,000 per batch:
    /// 19 ms a drain, not 3.)
    #[cfg(feature = "postgres")]
    #[tokio::test]
    #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    async fn a_large_postgres_batch_finds_its_rows_by_index() {
        let (pool, table) = postgres_table("courier_plan").await;
        sqlx::query(&format!(
            "INSERT INTO {table} (queue_name, body, headers, created_at, available_at) \
             SELECT 'default', repeat('x', 200), '{{}}', 1, 1 FROM generate_series(1, 60000)"
        ))
        .execute(&pool)
        .await
        .expect("the backlog");
        let sql = Statements::new(Dialect::Postgres, &table);
        let (Some(drain), Some(drain_take), Some(delete_and_claim)) =
            (sql.drain, sql.drain_take, sql.delete_and_claim)
        else {
            panic!("postgres drains, and deletes and claims in one statement");
        };
        let acked: Vec<i64> = (1..=1_000).collect();
        let mut failures = Vec::new();
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query(&format!("ANALYZE {table}"))
                    .execute(&pool)
                    .await
                    .expect("analyze");
            }
            for (what, statement) in [
                ("claim", &sql.claim),
                ("delete_and_claim", &delete_and_claim),
                ("drain", &drain),
                ("drain_take", &drain_take),
            ] {
                let explain = format!("EXPLAIN {statement}");
                let mut q = sqlx::query_scalar::<_, String>(&explain);
                if what == "drain_take" {
                    q = q.bind(acked.clone());
                } else {
                    if what == "delete_and_claim" {
                        q = q.bind(acked.clone()).bind(vec![7_i64; acked.len()]);
                    }
                    q = q.bind("default").bind(3_600_000_i64).bind(1_000_i64);
                    if what != "drain" {
                        q = q.bind(8_i64);
                    }
                }
                let plan = q.fetch_all(&pool).await.expect("explain").join("\n");
                if plan.contains("Seq Scan") || plan.contains("Sort Key") {
                    failures.push(format!("{what} (analyzed: {analyzed}):\n{plan}"));
                }
            }
        }
        // The table and the side table its migrations create (0009: the cursors).
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {table}, {table}_cursors"))
            .execute(&pool)
            .await;
        assert!(
            failures.is_empty(),
            "a scan or a sort of the whole backlog:\n{}",
            failures.join("\n")
        );
    }

    #[test]
    fn every_statement_binds_in_the_same_order_on_every_dialect() {
        for dialect in [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql] {
            let s = Statements::new(dialect, "t");
            assert!(!s.reschedule.contains("{now}"), "{dialect:?}");
            if dialect == Dialect::Postgres {
                assert!(s.reschedule.contains("headers = $1") && s.reschedule.contains("$7"));
            }
        }
    }
}
