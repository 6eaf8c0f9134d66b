//! Symfony's Doctrine table on SQLite (`symfony+sqlite://`): the statements Courier's
//! `DoctrineTransport` sends to PHP's `messenger_messages` layout, on a pool of their own, so that
//! the layout's own cost (PHP's three single-column indexes, text datetimes) is on both sides.
//! The table is the one the transport's setup made (the bench connects the transport first).

use courier_core::Dsn;

use super::sqlite::{Raw, err};
use crate::error::RawResult;

/// Now as the table holds it: PHP's wall clock (UTC here), whole seconds.
const NOW: &str = "strftime('%Y-%m-%d %H:%M:%S', 'now')";
/// The redelivery horizon: PHP's default `redeliver_timeout`, an hour.
const HORIZON: &str = "strftime('%Y-%m-%d %H:%M:%S', 'now', '-3600 seconds')";
/// What Symfony's serializer writes for a message of type `courier.bench`.
const HEADERS: &str = r#"{"type":"courier.bench","Content-Type":"application\/json"}"#;

impl Raw {
    /// The raw driver on Symfony's table, which the transport's setup made.
    pub(super) async fn symfony(dsn: &Dsn, fetch_size: usize) -> RawResult<Self> {
        let exposed = dsn.expose_without_query();
        let pool =
            super::sqlite::pool(exposed.strip_prefix("symfony+").unwrap_or(exposed), err).await?;
        let table = dsn.option("table_name").unwrap_or("messenger_messages");
        let insert = (1..=fetch_size)
            .map(|n| {
                let values = vec![format!("(?, ?, ?, {NOW}, {NOW})"); n].join(", ");
                format!(
                    "INSERT INTO {table} (body, headers, queue_name, created_at, available_at) \
                     VALUES {values} RETURNING id"
                )
            })
            .collect();
        let claim = format!(
            "UPDATE {table} SET delivered_at = {NOW} WHERE id IN (\
             SELECT id FROM {table} WHERE +queue_name = ?1 \
             AND (delivered_at IS NULL OR delivered_at < {HORIZON}) AND available_at <= {NOW} \
             ORDER BY available_at ASC LIMIT ?2) RETURNING id, body, headers"
        );
        Ok(Self {
            pool,
            queue: format!("bench_raw_{}", fastrand::u32(..)),
            table: table.to_owned(),
            insert,
            claim,
            symfony: Some(HEADERS),
        })
    }
}
