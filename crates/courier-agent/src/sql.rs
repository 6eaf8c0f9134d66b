//! What the SQL circuit breakers ([`crate::SqlBreakers`]) and token streams
//! ([`crate::SqlStreams`]) share: one query text run on whichever pool of the run store's
//! database they were given (SQLite or PostgreSQL).

/// Runs `$sql` (`$N` parameters; SQLite gets `?N`) on `$pool_of` (a `&courier_sql::SqlPool`):
/// `$body` sees the query as `$q` and the typed pool as `$pool`. Another dialect is
/// `Err($unsupported)`.
macro_rules! on_dialect {
    ($pool_of:expr, $sql:expr, $unsupported:expr, |$q:ident, $pool:ident| $body:expr) => {{
        match $pool_of {
            #[cfg(feature = "sqlite")]
            courier_sql::SqlPool::Sqlite($pool) => {
                let text = $sql.replace('$', "?");
                let $q = sqlx::query(&text);
                $body
            }
            #[cfg(feature = "postgres")]
            courier_sql::SqlPool::Postgres($pool) => {
                let text = $sql;
                let $q = sqlx::query(&text);
                $body
            }
            #[allow(unreachable_patterns, reason = "other dialects may be enabled in courier-sql")]
            _ => Err($unsupported),
        }
    }};
}

pub(crate) use on_dialect;
