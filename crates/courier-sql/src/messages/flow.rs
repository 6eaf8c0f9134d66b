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

/// The most rows of a queue's FIFO head that a head claim ranks.
const HEAD_ROWS: usize = 1_000;

/// PostgreSQL: the head sizes rendered; a claim ranks the smallest head of at least twice the
/// rows it asks for. Each is a constant of its statement: a `LIMIT` computed from the rows asked
/// for planned worse than 1,000 rows. `courier bench` (fetch 64, 100 keys, at most 10 each,
/// 20,000 messages): 11.3-11.6k msg/s ranking 1,000 rows, 17.5-17.6k ranking 256, 18.4-19.0k
/// ranking 128.
const PG_HEADS: [usize; 4] = [128, 256, 512, HEAD_ROWS];

impl FlowStatements {
    /// The head claim to try first for a claim of `asked` rows (None: fair, or not limited).
    pub(crate) fn head_claim(&self, asked: usize) -> Option<&str> {
        self.head_claims
            .iter()
            .find(|(rows, _)| *rows >= asked.saturating_mul(2))
            .or(self.head_claims.last())
            .map(|(_, sql)| sql.as_str())
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
            // PostgreSQL counts the busy slots of the head's keys only: one range of the
            // concurrency index `(queue_name, concurrency_key, delivered_at)` per key, a subquery
            // per key so that the planner seeks each key's range rather than joining the whole
            // queue's index, its start `(SELECT now - window)` computed once (a bound of the
            // index range; `clock_timestamp()` itself is volatile, so written inline it is a
            // filter over every row of the key). The pick of 64 rows among 20,000 of 100 keys,
            // 640 in flight: 6.6 ms before, 3.2 ms after (13.6 ms with the filter). `b` is
            // MATERIALIZED (counted once): where the statistics say the queue is empty (another
            // queue of the table filled them), the planner would otherwise count every key
            // again for each of the head's rows (90 ms a claim).
            (Some(max), Dialect::Postgres) => PG_HEADS.map(|head| (head, r(format!(
                "WITH h AS (SELECT id, priority, available_at, concurrency_key FROM {t} \
                 WHERE queue_name = $1 AND available_at <= {{now}} \
                 AND (delivered_at IS NULL OR delivered_at < {{now}} - $2) \
                 ORDER BY priority DESC, available_at, id LIMIT {head}), \
                 b AS MATERIALIZED (SELECT k.concurrency_key, (SELECT COUNT(*) FROM {t} c WHERE c.queue_name = $1 \
                 AND c.concurrency_key = k.concurrency_key AND c.delivered_at >= (SELECT {{now}} - $2)) AS busy \
                 FROM (SELECT DISTINCT concurrency_key FROM h WHERE concurrency_key IS NOT NULL) k), \
                 picked AS (SELECT ARRAY(SELECT r.id FROM (SELECT h.*, ROW_NUMBER() OVER \
                 (PARTITION BY concurrency_key ORDER BY priority DESC, available_at, id) AS rn FROM h) r \
                 LEFT JOIN b ON b.concurrency_key = r.concurrency_key \
                 WHERE r.concurrency_key IS NULL OR r.rn + COALESCE(b.busy, 0) <= {max} \
                 ORDER BY r.priority DESC, r.available_at, r.id LIMIT $3) AS ids) \
                 UPDATE {t} SET delivered_at = {{now}}, delivery_id = $4 FROM picked \
                 WHERE {t}.id = ANY(picked.ids) AND ({t}.delivered_at IS NULL OR {t}.delivered_at < {{now}} - $2) \
                 RETURNING {t}.id, {t}.body, {t}.headers, {t}.priority, {t}.available_at"
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
                Some(
                    "SELECT set_config('enable_sort', 'on', true), \
                     set_config('enable_bitmapscan', 'off', true), \
                     set_config('enable_seqscan', 'off', true), pg_advisory_xact_lock(hashtext($1))"
                        .to_owned(),
                ),
                None,
            ),
            Dialect::Mysql => (
                Some("SELECT GET_LOCK(?, ?)".to_owned()),
                Some("SELECT RELEASE_LOCK(?)".to_owned()),
            ),
        };
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
