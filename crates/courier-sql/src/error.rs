//! Classifying driver errors: which are transient (retried inside the transport with capped
//! backoff) and which [`TransportErrorKind`] the others become.

use std::future::Future;
use std::time::Duration;

use courier_core::{Backoff, Jitter, TransportError, TransportErrorKind};

/// Database error codes worth retrying: PostgreSQL SQLSTATEs (serialization failure, deadlock,
/// lock not available, admin shutdown / terminated backend, a session ended as idle, connection
/// exceptions), MySQL /
/// MariaDB SQLSTATEs (`40001` deadlock, `08S01` link failure, `70100` connection killed), and
/// SQLite extended result codes (`SQLITE_BUSY*`, `SQLITE_LOCKED*`).
const TRANSIENT_CODES: &[&str] = &[
    "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "08000", "08001", "08003", "08004",
    "08006", "08S01", "70100", "HYT00", "5", "6", "261", "262", "517", "773", "57P05", "25P03",
];

/// MySQL / MariaDB error numbers worth retrying (their SQLSTATE is the generic `HY000`):
/// 1205 lock wait timeout, 1213 deadlock, 1927 connection killed, 2006 / 2013 server gone.
#[cfg(feature = "mysql")]
const TRANSIENT_MYSQL_NUMBERS: &[u16] = &[1205, 1213, 1927, 2006, 2013];

/// The most attempts an operation gets when it keeps failing transiently.
const MAX_ATTEMPTS: u32 = 10;
/// The wait between two attempts: 10 ms doubling up to 2 s, spread by +-25 % so that clients
/// that failed together do not retry together.
const BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_secs(2)).jitter(Jitter::Spread(0.25));

/// Whether retrying the same statement may succeed (exhaustive over what we recognise; every
/// other error is permanent). A protocol error is permanent: the statement may have taken
/// effect (an insert that reports a wrong row count), so running it again could repeat it.
#[must_use]
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                && TRANSIENT_MYSQL_NUMBERS.contains(&my.number())
            {
                return true;
            }
            db.code()
                .is_some_and(|c| TRANSIENT_CODES.contains(&c.as_ref()))
        }
        _ => false,
    }
}

/// A transport error for a failed driver call; `context` says what was being done.
pub(crate) fn transport_error(name: &str, context: &'static str, e: sqlx::Error) -> TransportError {
    let kind = match &e {
        sqlx::Error::PoolTimedOut => TransportErrorKind::Timeout,
        sqlx::Error::Configuration(_) => TransportErrorKind::Config,
        sqlx::Error::RowNotFound => TransportErrorKind::NotFound,
        _ if is_transient(&e) => TransportErrorKind::Connection,
        _ => TransportErrorKind::Protocol,
    };
    TransportError::new(kind, name.to_owned())
        .with_context(context)
        .with_source(e)
}

/// Runs `op` until it succeeds, fails permanently, or has failed transiently (see
/// [`is_transient`]: a deadlock, a lock wait timeout, a dropped connection) 10 times, sleeping
/// 10 ms doubling up to 2 s (+-25 %) in between; `what` names the operation in the debug log of
/// each retry. `op` must be safe to run again after a transient failure: one statement, or one
/// transaction, that the database rolled back whole.
///
/// ```no_run
/// # async fn f(pool: sqlx::SqlitePool) -> Result<(), sqlx::Error> {
/// courier_sql::retry_transient("ack", || sqlx::query("DELETE FROM t WHERE id = 1").execute(&pool))
///     .await?;
/// # Ok(())
/// # }
/// ```
pub async fn retry_transient<T, F, Fut>(what: &'static str, mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut waits = BACKOFF.attempts();
    let mut attempt = 1;
    loop {
        match op().await {
            // A pool that timed out has already waited its whole `acquire_timeout` (retrying
            // connections all along): waiting it out again would hide a server that is down.
            Err(e)
                if attempt < MAX_ATTEMPTS
                    && is_transient(&e)
                    && !matches!(e, sqlx::Error::PoolTimedOut) =>
            {
                tracing::debug!(courier.sql.op = what, attempt, error = %e, "transient database error, retrying");
                tokio::time::sleep(waits.failed()).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_transient_and_become_connection_errors() {
        let e = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert!(is_transient(&e));
        let t = transport_error("async", "claiming messages", e);
        assert_eq!(t.kind(), TransportErrorKind::Connection);
        assert!(t.is_transient());
    }

    #[tokio::test]
    async fn a_pool_timeout_is_not_waited_out_again_but_io_errors_are_retried() {
        let mut calls = 0;
        let timed_out: Result<(), _> = retry_transient("x", || {
            calls += 1;
            async { Err(sqlx::Error::PoolTimedOut) }
        })
        .await;
        assert!(matches!(timed_out, Err(sqlx::Error::PoolTimedOut)));
        assert_eq!(calls, 1);

        let mut calls = 0;
        let recovered = retry_transient("x", || {
            calls += 1;
            let fail = calls < 3;
            async move {
                if fail {
                    Err(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()))
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(recovered.ok(), Some(7));
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn a_protocol_error_is_permanent_and_never_retried() {
        // An insert that reports a wrong row count raises Protocol after it may have inserted:
        // running it again could store the messages twice.
        let e = sqlx::Error::Protocol("inserted 1 rows for 2 messages".into());
        assert!(!is_transient(&e));
        let mut calls = 0;
        let failed: Result<(), _> = retry_transient("x", || {
            calls += 1;
            async {
                Err(sqlx::Error::Protocol(
                    "inserted 1 rows for 2 messages".into(),
                ))
            }
        })
        .await;
        assert!(matches!(failed, Err(sqlx::Error::Protocol(_))));
        assert_eq!(calls, 1, "tried once");
        assert_eq!(
            transport_error("a", "inserting messages", e).kind(),
            TransportErrorKind::Protocol
        );
    }

    #[test]
    fn decode_errors_are_permanent() {
        let e = sqlx::Error::ColumnNotFound("x".into());
        assert!(!is_transient(&e));
        assert_eq!(
            transport_error("a", "b", e).kind(),
            TransportErrorKind::Protocol
        );
    }
}
