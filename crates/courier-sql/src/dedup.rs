//! Deduplication keys ([`DeduplicateStamp`](courier_core::DeduplicateStamp)) in
//! `<table>_dedup`, beside the message table: one row per key, taken until `expires_at` (epoch
//! milliseconds from the database clock).
//!
//! Taking a key is one statement on PostgreSQL and SQLite, an upsert that replaces only an
//! expired row (`INSERT ... ON CONFLICT (dedup_key) DO UPDATE ... WHERE expires_at <= now`): one
//! row written means taken. MySQL counts a matched row as written (`CLIENT_FOUND_ROWS`), so
//! there it is two: the expired row is deleted, then `INSERT IGNORE` takes the key if it is free.

use crate::Dialect;

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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
