//! Connecting at `consume` start while a broker or database is down: every transport and the
//! run store are retried with capped exponential backoff (0.5 s doubling up to 30 s), each
//! failure logged at WARN with what was being reached (its redacted DSN) and the error, until it
//! comes up or the worker is asked to stop (then `consume` exits 0). A DSN or option that is
//! wrong is not retried: exit 2 at once.

use std::future::Future;
use std::time::Duration;

use courier_core::{Backoff, CancellationToken};

use crate::error::{CliError, scrub};

/// The waits between attempts: 0.5 s doubling up to 30 s.
const CONNECT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// Why an attempt to reach a server failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server is unreachable for now (refused, timed out, connection broken): worth retrying.
    Down {
        /// What was being reached, e.g. ``transport `async` (postgres://app:***@db/app)``.
        what: String,
        /// The error, with its causes.
        error: String,
    },
    /// Retrying cannot help (a bad DSN or option, a protocol error): the command fails.
    Fatal(CliError),
}

impl Failure {
    /// The command's error when there is no retrying (every command but `consume`): exit 1.
    pub(crate) fn into_error(self) -> CliError {
        match self {
            Self::Down { what, error } => {
                CliError::runtime(format!("cannot reach {what}: {error}"))
            }
            Self::Fatal(e) => e,
        }
    }
}

impl From<CliError> for Failure {
    fn from(e: CliError) -> Self {
        Self::Fatal(e)
    }
}

/// Runs `attempt` until it succeeds, retrying while it fails with [`Failure::Down`]. `None`
/// when `shutdown` was cancelled first.
pub(crate) async fn until_up<T, F, Fut>(
    shutdown: &CancellationToken,
    attempt: F,
) -> Result<Option<T>, CliError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    retry(shutdown, CONNECT_BACKOFF, attempt).await
}

async fn retry<T, F, Fut>(
    shutdown: &CancellationToken,
    backoff: Backoff,
    mut attempt: F,
) -> Result<Option<T>, CliError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut attempts = backoff.attempts();
    loop {
        let result = tokio::select! {
            result = attempt() => result,
            () = shutdown.cancelled() => return Ok(None),
        };
        match result {
            Ok(value) => {
                if attempts.failures() > 0 {
                    tracing::warn!(
                        attempts = attempts.failures() + 1,
                        "connected after retrying"
                    );
                }
                return Ok(Some(value));
            }
            Err(Failure::Fatal(e)) => return Err(e),
            Err(Failure::Down { what, error }) => {
                let delay = attempts.failed();
                tracing::warn!(
                    attempt = attempts.failures(),
                    "{} is unavailable: {}; retrying in {} (stop with Ctrl-C)",
                    scrub(&what),
                    scrub(&error),
                    humantime::format_duration(delay)
                );
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let secs: Vec<f64> = CONNECT_BACKOFF
            .attempts()
            .take(9)
            .map(|d| d.as_secs_f64())
            .collect();
        assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
    }

    #[tokio::test]
    async fn retries_while_down_until_up() {
        let shutdown = CancellationToken::new();
        let mut calls = 0;
        let ms = Duration::from_millis(1);
        let got = retry(&shutdown, Backoff::new(ms, ms * 4), || {
            calls += 1;
            let n = calls;
            async move {
                if n < 5 {
                    Err(Failure::Down {
                        what: "transport `async`".into(),
                        error: "connection refused".into(),
                    })
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got.ok().flatten(), Some(5));
    }

    #[tokio::test]
    async fn a_shutdown_ends_the_retrying_and_a_fatal_error_is_not_retried() {
        let shutdown = CancellationToken::new();
        let stopper = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            stopper.cancel();
        });
        let ms = Duration::from_millis(1);
        let got: Result<Option<()>, CliError> =
            retry(&shutdown, Backoff::new(ms, ms * 4), || async {
                Err(Failure::Down {
                    what: "run store".into(),
                    error: "refused".into(),
                })
            })
            .await;
        assert!(matches!(got, Ok(None)));
        let mut calls = 0;
        let got: Result<Option<()>, CliError> = until_up(&CancellationToken::new(), || {
            calls += 1;
            async { Err(Failure::Fatal(CliError::usage("bad dsn"))) }
        })
        .await;
        assert_eq!(got.err().map(|e| e.exit_code()), Some(2));
        assert_eq!(calls, 1);
    }
}
