//! Deduplication keys ([`DeduplicateStamp`](courier_core::DeduplicateStamp)) in
//! `<table>_dedup`, beside the message table: one row per key, taken until `expires_at` (epoch
//! milliseconds from the database clock).
//!
//! Taking a key is one statement on PostgreSQL and SQLite, an upsert that replaces only an
//! expired row (`INSERT ... ON CONFLICT (dedup_key) DO UPDATE ... WHERE expires_at <= now`): one
//! row written means taken. MySQL counts a matched row as written (`CLIENT_FOUND_ROWS`), so
//! there it is two: the expired row is deleted, then `INSERT IGNORE` takes the key if it is free.
//! A send takes the keys of its messages in the transaction that inserts them (`dispatch_in` in
//! the caller's), so a key exists exactly when its message does.
//!
//! Expired rows of keys never taken again are pruned in passes of at most [`PRUNE_BATCH`] rows,
//! oldest first, found by the `expires_at` index (migration 0010): one statement whose cost does
//! not grow with the table.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::Dialect;

/// The most expired keys one prune pass deletes.
pub(crate) const PRUNE_BATCH: usize = 1_000;

/// How long after a pass that found fewer than [`PRUNE_BATCH`] expired keys the next one is due
/// (after a full pass, the next is due at once).
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// When a transport prunes its expired keys next; one pass at a time.
#[derive(Debug)]
pub(crate) struct PruneClock {
    next: Mutex<Instant>,
    running: AtomicBool,
}

impl PruneClock {
    /// A clock whose first pass is due at once.
    pub(crate) fn new() -> Self {
        Self {
            next: Mutex::new(Instant::now()),
            running: AtomicBool::new(false),
        }
    }

    /// The turn to run a pass, when one is due and none is running.
    pub(crate) fn turn(&self) -> Option<PruneTurn<'_>> {
        let now = Instant::now();
        if *self.next.lock().unwrap_or_else(PoisonError::into_inner) > now {
            return None;
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(PruneTurn {
            clock: self,
            next: now + PRUNE_EVERY,
        })
    }
}

/// A pass under way: when it ends (or is dropped, failed or cancelled), the next is due
/// [`PRUNE_EVERY`] later, or at once after a full pass.
#[derive(Debug)]
pub(crate) struct PruneTurn<'a> {
    clock: &'a PruneClock,
    next: Instant,
}

impl PruneTurn<'_> {
    /// The pass deleted `n` keys.
    pub(crate) fn pruned(mut self, n: u64) {
        if n >= PRUNE_BATCH as u64 {
            self.next = Instant::now();
        }
    }
}

impl Drop for PruneTurn<'_> {
    fn drop(&mut self) {
        *self
            .clock
            .next
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = self.next;
        self.clock.running.store(false, Ordering::Release);
    }
}

/// The longest key the table holds, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 190;

/// The deduplication table of a message table.
#[must_use]
pub(crate) fn dedup_table(messages: &str) -> String {
    format!("{messages}_dedup")
}

/// The statements on one deduplication table, rendered for one dialect.
#[derive(Debug)]
pub(crate) struct DedupStatements {
    /// Binds: key, ttl ms. One row affected: taken. (MySQL: after `clear_expired`.)
    pub(crate) take: String,
    /// MySQL only (binds: key): deletes the key's row when expired.
    pub(crate) clear_expired: Option<String>,
    /// Binds: key.
    pub(crate) release: String,
    /// Deletes up to a number of expired rows, oldest first (binds: the number).
    pub(crate) prune: String,
}

impl DedupStatements {
    pub(crate) fn new(dialect: Dialect, messages: &str) -> Self {
        let t = dedup_table(messages);
        let (take, clear_expired) = match dialect {
            Dialect::Postgres | Dialect::Sqlite => (
                format!(
                    "INSERT INTO {t} (dedup_key, expires_at) VALUES (?, {{now}} + ?) \
                     ON CONFLICT (dedup_key) DO UPDATE SET expires_at = excluded.expires_at \
                     WHERE {t}.expires_at <= {{now}}"
                ),
                None,
            ),
            Dialect::Mysql => (
                format!("INSERT IGNORE INTO {t} (dedup_key, expires_at) VALUES (?, {{now}} + ?)"),
                Some(dialect.render(&format!(
                    "DELETE FROM {t} WHERE dedup_key = ? AND expires_at <= {{now}}"
                ))),
            ),
        };
        Self {
            take: dialect.render(&take),
            clear_expired,
            release: dialect.render(&format!("DELETE FROM {t} WHERE dedup_key = ?")),
            prune: dialect.render(&match dialect {
                // The keys as one array, so the delete probes the primary key (see the claim);
                // rows a take is replacing right now are skipped, not waited for.
                Dialect::Postgres => format!(
                    "DELETE FROM {t} WHERE dedup_key = ANY(ARRAY(SELECT dedup_key FROM {t} \
                     WHERE expires_at <= {{now}} ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED))"
                ),
                Dialect::Sqlite => format!(
                    "DELETE FROM {t} WHERE dedup_key IN (SELECT dedup_key FROM {t} \
                     WHERE expires_at <= {{now}} ORDER BY expires_at LIMIT ?)"
                ),
                // MySQL allows no LIMIT in an IN subquery, but a single-table DELETE has one.
                Dialect::Mysql => format!(
                    "DELETE FROM {t} WHERE expires_at <= {{now}} ORDER BY expires_at LIMIT ?"
                ),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// The statement that fills a deduplication table with 100,000 keys that expired long ago.
    fn expired_keys(dialect: Dialect, t: &str) -> String {
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL \
                      SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let n = "(a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d)";
        let key = if dialect == Dialect::Mysql {
            format!("CONCAT('old-', {n})")
        } else {
            format!("'old-' || CAST({n} AS VARCHAR(10))")
        };
        format!(
            "INSERT INTO {t} (dedup_key, expires_at) SELECT {key}, 1000 + {n} \
             FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f"
        )
    }

    /// The deduplication table's DDL, one statement per migration.
    fn ddl(dialect: Dialect, t: &str) -> Vec<String> {
        crate::migrate::DEDUP
            .list
            .iter()
            .filter_map(|m| m.template(dialect))
            .map(|s| crate::migrate::render(s, &[("{dedup}", t)]))
            .collect()
    }

    /// With 100,000 expired keys, a prune pass on SQLite finds its rows by the `expires_at`
    /// index, in order, and the delete finds them by the key: no scan of the table, no sort.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_sqlite_prune_pass_reads_the_expiry_index_not_the_table() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let t = "jobs_dedup";
        for statement in ddl(Dialect::Sqlite, t) {
            sqlx::raw_sql(&statement).execute(&pool).await.unwrap();
        }
        sqlx::query(&expired_keys(Dialect::Sqlite, t))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
        let sql = DedupStatements::new(Dialect::Sqlite, "jobs");
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {}", sql.prune))
            .bind(PRUNE_BATCH as i64)
            .fetch_all(&pool)
            .await
            .unwrap();
        let plan: Vec<String> = rows
            .iter()
            .map(|r| sqlx::Row::get::<String, _>(r, "detail"))
            .collect();
        let plan = plan.join("\n");
        assert!(plan.contains("jobs_dedup_exp_idx"), "{plan}");
        assert!(
            !plan.contains("SCAN ") && !plan.contains("TEMP B-TREE"),
            "a scan or a sort of the whole table:\n{plan}"
        );
        let pruned = sqlx::query(&sql.prune)
            .bind(PRUNE_BATCH as i64)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(pruned.rows_affected(), PRUNE_BATCH as u64);
    }

    /// The same on PostgreSQL, analyzed or not: the pass walks the `expires_at` index and
    /// deletes by the primary key; a take finds its key by the primary key.
    #[cfg(feature = "postgres")]
    #[tokio::test]
    #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    async fn a_postgres_prune_pass_reads_the_expiry_index_not_the_table() {
        let url = courier_test::env::postgres_url();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let messages = format!("courier_dedup_plan_{}", fastrand::u32(..));
        let t = dedup_table(&messages);
        for statement in ddl(Dialect::Postgres, &t) {
            sqlx::raw_sql(&statement).execute(&pool).await.unwrap();
        }
        sqlx::query(&expired_keys(Dialect::Postgres, &t))
            .execute(&pool)
            .await
            .unwrap();
        let sql = DedupStatements::new(Dialect::Postgres, &messages);
        let mut failures = Vec::new();
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query(&format!("ANALYZE {t}"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            let prune = sqlx::query_scalar::<_, String>(&format!("EXPLAIN {}", sql.prune))
                .bind(PRUNE_BATCH as i64)
                .fetch_all(&pool)
                .await
                .unwrap()
                .join("\n");
            if prune.contains("Seq Scan")
                || prune.contains("Sort Key")
                || !prune.contains("_exp_idx")
            {
                failures.push(format!("prune (analyzed: {analyzed}):\n{prune}"));
            }
            let take = sqlx::query_scalar::<_, String>(&format!("EXPLAIN {}", sql.take))
                .bind("order-1")
                .bind(3_600_000_i64)
                .fetch_all(&pool)
                .await
                .unwrap()
                .join("\n");
            if take.contains("Seq Scan") {
                failures.push(format!("take (analyzed: {analyzed}):\n{take}"));
            }
        }
        let pruned = sqlx::query(&sql.prune)
            .bind(PRUNE_BATCH as i64)
            .execute(&pool)
            .await
            .unwrap()
            .rows_affected();
        let _ = sqlx::query(&format!("DROP TABLE {t}")).execute(&pool).await;
        assert!(
            failures.is_empty(),
            "a scan or a sort of the whole table:\n{}",
            failures.join("\n")
        );
        assert_eq!(pruned, PRUNE_BATCH as u64);
    }

    /// The same on MySQL / MariaDB: the delete is a range on the `expires_at` index, in its
    /// order (no `ALL` access, no filesort).
    #[cfg(feature = "mysql")]
    #[tokio::test]
    #[ignore = "needs MySQL/MariaDB: set COURIER_TEST_MYSQL_URL"]
    async fn a_mysql_prune_pass_reads_the_expiry_index_not_the_table() {
        let url = courier_test::env::mysql_url();
        let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
        let messages = format!("courier_dedup_plan_{}", fastrand::u32(..));
        let t = dedup_table(&messages);
        for statement in ddl(Dialect::Mysql, &t) {
            sqlx::raw_sql(&statement).execute(&pool).await.unwrap();
        }
        sqlx::query(&expired_keys(Dialect::Mysql, &t))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(&format!("ANALYZE TABLE {t}"))
            .execute(&pool)
            .await
            .unwrap();
        let sql = DedupStatements::new(Dialect::Mysql, &messages);
        let rows = sqlx::query(&format!("EXPLAIN {}", sql.prune))
            .bind(PRUNE_BATCH as i64)
            .fetch_all(&pool)
            .await
            .unwrap();
        let text = |r: &sqlx::mysql::MySqlRow, c: &str| -> String {
            sqlx::Row::try_get::<Option<String>, _>(r, c)
                .ok()
                .flatten()
                .or_else(|| {
                    sqlx::Row::try_get_unchecked::<Option<Vec<u8>>, _>(r, c)
                        .ok()
                        .flatten()
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                })
                .unwrap_or_default()
        };
        let plan: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (text(r, "type"), text(r, "key"), text(r, "Extra")))
            .collect();
        let pruned = sqlx::query(&sql.prune)
            .bind(PRUNE_BATCH as i64)
            .execute(&pool)
            .await
            .unwrap()
            .rows_affected();
        let _ = sqlx::query(&format!("DROP TABLE {t}")).execute(&pool).await;
        assert!(
            plan.iter().all(|(access, key, extra)| access != "ALL"
                && key.ends_with("_exp_idx")
                && !extra.contains("filesort")),
            "a scan or a sort of the whole table: {plan:?}"
        );
        assert_eq!(pruned, PRUNE_BATCH as u64);
    }

    #[test]
    fn take_replaces_only_an_expired_row() {
        let pg = DedupStatements::new(Dialect::Postgres, "jobs");
        assert!(pg.take.starts_with("INSERT INTO jobs_dedup"), "{}", pg.take);
        assert!(
            pg.take.contains("WHERE jobs_dedup.expires_at <="),
            "{}",
            pg.take
        );
        assert!(pg.take.contains("$1") && pg.take.contains("$2"));
        assert!(pg.clear_expired.is_none());
        let my = DedupStatements::new(Dialect::Mysql, "jobs");
        assert!(my.take.starts_with("INSERT IGNORE INTO jobs_dedup"));
        assert!(
            my.clear_expired
                .is_some_and(|s| s.contains("expires_at <="))
        );
    }
}
