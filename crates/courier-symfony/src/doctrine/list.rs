//! [`Listable`] on Symfony's Doctrine table: what `courier failed show / retry / remove` uses on
//! a Symfony failure transport (a `queue_name` such as `failed`).

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chrono::{NaiveDateTime, TimeZone};
use chrono_tz::Tz;
use courier_core::{Envelope, Listable, SentToFailureTransportStamp, TransportError};

use super::DoctrineTransport;
use super::sql::{Pool, Row};

/// The rows PHP has not acked: on MySQL / MariaDB PHP's ack sets `delivered_at` to
/// 9999-12-31 23:59:59 and leaves the row for its next fetch to delete.
const NOT_ACKED: &str = "(delivered_at IS NULL OR delivered_at < '9999-01-01 00:00:00')";

/// `$body` with `$pool` bound to the pool of each database.
macro_rules! on_pool {
    ($self:expr, $pool:ident => $body:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            Pool::Postgres($pool) => $body,
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(db) => {
                let $pool = &db.pool;
                $body
            }
            #[cfg(feature = "mysql")]
            Pool::Mysql($pool) => $body,
        }
    };
}

/// Browsing a queue without claiming.
impl Pool {
    /// The `n`th parameter of a statement (in order: MySQL's `?` are positional).
    fn param(&self, n: usize) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => format!("${n}"),
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => format!("?{n}"),
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => {
                let _ = n;
                "?".to_owned()
            }
        }
    }

    /// `created_at` as text, `Y-m-d H:i:s` (PHP's zone, as stored).
    fn created_text(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "to_char(created_at, 'YYYY-MM-DD HH24:MI:SS')",
            #[cfg(feature = "sqlite")]
            Self::Sqlite(_) => "CAST(created_at AS TEXT)",
            #[cfg(feature = "mysql")]
            Self::Mysql(_) => "DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s')",
        }
    }

    /// Up to `limit` rows of `queue` not acked, due first, without claiming them, each with its
    /// `created_at`.
    pub(crate) async fn list(
        &self,
        t: &str,
        queue: &str,
        limit: usize,
    ) -> Result<Vec<(Row, String)>, sqlx::Error> {
        let sql = format!(
            "SELECT id, body, headers, {} FROM {t} WHERE queue_name = {} AND {NOT_ACKED} \
             ORDER BY available_at ASC, id ASC LIMIT {}",
            self.created_text(),
            self.param(1),
            self.param(2)
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, String, String)> = on_pool!(self, pool => {
            sqlx::query_as(&sql).bind(queue).bind(limit).fetch_all(pool).await?
        });
        Ok(rows
            .into_iter()
            .map(|(id, body, headers, created)| (Row { id, body, headers }, created))
            .collect())
    }

    /// The row `id` of `queue`, if there and not acked, with its `created_at`.
    pub(crate) async fn find(
        &self,
        t: &str,
        queue: &str,
        id: i64,
    ) -> Result<Option<(Row, String)>, sqlx::Error> {
        let sql = format!(
            "SELECT id, body, headers, {} FROM {t} WHERE id = {} AND queue_name = {} AND {NOT_ACKED}",
            self.created_text(),
            self.param(1),
            self.param(2)
        );
        let row: Option<(i64, String, String, String)> = on_pool!(self, pool => {
            sqlx::query_as(&sql).bind(id).bind(queue).fetch_optional(pool).await?
        });
        Ok(row.map(|(id, body, headers, created)| (Row { id, body, headers }, created)))
    }

    /// Deletes the row `id` of `queue`; whether there was one not acked.
    pub(crate) async fn remove(&self, t: &str, queue: &str, id: i64) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "DELETE FROM {t} WHERE id = {} AND queue_name = {} AND {NOT_ACKED}",
            self.param(1),
            self.param(2)
        );
        let removed = on_pool!(self, pool => {
            sqlx::query(&sql).bind(id).bind(queue).execute(pool).await?.rows_affected()
        });
        Ok(removed > 0)
    }
}

/// A `created_at` as stored (`Y-m-d H:i:s`, wall-clock in `zone`), or `None` when it does
/// not read as one.
fn stored_time(text: &str, zone: Tz) -> Option<SystemTime> {
    let local = NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%d %H:%M:%S").ok()?;
    let at = zone.from_local_datetime(&local).earliest()?;
    Some(SystemTime::from(at.with_timezone(&chrono::Utc)))
}

impl DoctrineTransport {
    /// A listed row: decoded, and dated, when its `SentToFailureTransportStamp` says no time
    /// (PHP's carries none), by the row's `created_at`: when it entered the failure table.
    fn listed(&self, (row, created): (Row, String)) -> Envelope {
        let envelope = self.decode(row);
        let undated = envelope
            .all::<SentToFailureTransportStamp>()
            .any(|s| s.at == UNIX_EPOCH);
        let Some(created) = stored_time(&created, self.options.zone).filter(|_| undated) else {
            return envelope;
        };
        let stamps: Vec<SentToFailureTransportStamp> = envelope
            .all::<SentToFailureTransportStamp>()
            .cloned()
            .collect();
        stamps.into_iter().fold(
            envelope.without_all::<SentToFailureTransportStamp>(),
            |envelope, mut stamp| {
                if stamp.at == UNIX_EPOCH {
                    stamp.at = created;
                }
                envelope.with(stamp)
            },
        )
    }
}

/// The messages of the transport's queue, acked ones left out, without claiming them: each with
/// its row id ([`TransportMessageIdStamp`](courier_core::TransportMessageIdStamp)) and the
/// stamps PHP wrote (`ErrorDetailsStamp`, `SentToFailureTransportStamp`, ...).
#[async_trait]
impl Listable for DoctrineTransport {
    async fn list(&self, limit: usize) -> Result<Vec<Envelope>, TransportError> {
        let rows = self
            .pool
            .list(&self.options.table_name, &self.options.queue_name, limit)
            .await
            .map_err(|e| self.db_error("listing messages", e))?;
        Ok(rows.into_iter().map(|row| self.listed(row)).collect())
    }

    async fn find(&self, id: &str) -> Result<Option<Envelope>, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        let row = self
            .pool
            .find(&self.options.table_name, &self.options.queue_name, id)
            .await
            .map_err(|e| self.db_error("finding a message", e))?;
        Ok(row.map(|row| self.listed(row)))
    }

    async fn remove(&self, id: &str) -> Result<bool, TransportError> {
        let Ok(id) = id.parse::<i64>() else {
            return Ok(false);
        };
        self.pool
            .remove(&self.options.table_name, &self.options.queue_name, id)
            .await
            .map_err(|e| self.db_error("removing a message", e))
    }
}
