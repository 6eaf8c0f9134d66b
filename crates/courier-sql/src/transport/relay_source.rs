//! The relay-source hooks: draining ([`Drain`], PostgreSQL) and reading by a cursor
//! ([`CursorSource`], PostgreSQL with `cursor=true`), with the cursor's lease and the adoption
//! of rows written without a transaction id.

use std::time::Duration;

use courier_core::{DelayStamp, Envelope, TransportError, TransportErrorKind, async_trait};
use tokio::time::Instant;

use super::SqlTransport;
use crate::backend::StoredRow;
use crate::error::transport_error;
use crate::relay::{CursorLease, CursorPosition, CursorSource, Drain, Drained};

/// How often a busy cursor outbox's reads look for rows written without `cursor=true` (an idle
/// one looks once per empty poll window).
const STRAYS_EVERY: Duration = Duration::from_secs(60);

/// PostgreSQL: what a relay reads an outbox with (one delete per row, held in a transaction
/// until the destination confirmed).
#[async_trait]
impl Drain for SqlTransport {
    async fn drain(
        &self,
        max: usize,
        hold_for: Duration,
        held: &tokio::sync::Notify,
    ) -> Result<Drained, TransportError> {
        // Like `get_after`, with the drain statements.
        if max == 0 {
            return Ok(Drained::empty());
        }
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let (rows, hold) = self
                .attempt("draining messages", || async {
                    self.backend
                        .drain(&self.name, max, hold_for, held)
                        .await
                        .unwrap_or_else(|| {
                            Err(sqlx::Error::Configuration(
                                "draining needs PostgreSQL".into(),
                            ))
                        })
                })
                .await?;
            if !rows.is_empty() {
                return Ok(Drained::new(self.decode_all(rows).collect(), hold));
            }
            // Nothing held: dropping the hold rolls its empty transaction back.
            drop(hold);
            if !self.wait_for_more(&mut window).await? {
                return Ok(Drained::empty());
            }
        }
    }
}

#[async_trait]
impl CursorSource for SqlTransport {
    async fn acquire(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<Box<dyn CursorLease>>, TransportError> {
        let Some(cursor) = self.backend.cursor() else {
            return Err(not_a_cursor(&self.name));
        };
        let taken = self
            .attempt("taking the outbox cursor", || cursor.acquire(owner, lease))
            .await?;
        Ok(taken.map(|(session, (major, minor))| {
            Box::new(SqlCursorLease {
                name: self.name.clone(),
                session,
                position: CursorPosition { major, minor },
            }) as Box<dyn CursorLease>
        }))
    }

    async fn read(
        &self,
        after: CursorPosition,
        max: usize,
    ) -> Result<(Vec<Envelope>, CursorPosition), TransportError> {
        let Some(cursor) = self.backend.cursor() else {
            return Err(not_a_cursor(&self.name));
        };
        if max == 0 {
            return Ok((Vec::new(), after));
        }
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let rows = self
                .attempt("reading the outbox", || {
                    cursor.read((after.major, after.minor), max)
                })
                .await?;
            if !rows.is_empty() && self.strays_due() {
                self.adopt_strays(cursor).await;
            }
            if let Some((last, tx, _)) = rows.last() {
                let to = CursorPosition {
                    major: *tx,
                    minor: last.id,
                };
                let (rows, delays): (Vec<StoredRow>, Vec<i64>) =
                    rows.into_iter().map(|(row, _, left)| (row, left)).unzip();
                let envelopes = self
                    .decode_all(rows)
                    .zip(delays)
                    .map(|(envelope, left)| {
                        // What is left of the delay goes on to the destination; a delay that
                        // ran out is served.
                        let envelope = envelope.without_all::<DelayStamp>();
                        match u64::try_from(left) {
                            Ok(ms) if ms > 0 => {
                                envelope.with(DelayStamp(Duration::from_millis(ms)))
                            }
                            _ => envelope,
                        }
                    })
                    .collect();
                return Ok((envelopes, to));
            }
            // Nothing past the cursor yet, or only rows of transactions newer than one still
            // running: wait for a wake-up (a NOTIFY on insert) or the next idle step.
            let now = Instant::now();
            if now >= window.deadline {
                self.adopt_strays(cursor).await;
                return Ok((Vec::new(), after));
            }
            let step = window.idle.failed().min(window.deadline - now);
            tokio::select! {
                () = tokio::time::sleep(step) => {}
                _ = window.changes.changed() => {}
            }
        }
    }
}

impl SqlTransport {
    /// Whether a busy cursor outbox's read should look for strays ([`STRAYS_EVERY`]).
    fn strays_due(&self) -> bool {
        self.strays_checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
            >= STRAYS_EVERY
    }

    /// Once a cursor outbox's read found nothing for a whole poll window: adopts rows that
    /// reached the queue without a transaction id (written by a producer whose DSN lacks
    /// `cursor=true`), which the cursor would never read. Best effort: tried again next time.
    async fn adopt_strays(&self, cursor: &dyn crate::backend::CursorRows) {
        *self
            .strays_checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        match cursor.adopt().await {
            Ok(0) => {}
            Ok(rows) => tracing::warn!(transport = %self.name, rows,
                "rows reached the cursor outbox without a transaction id (does a producer's DSN lack cursor=true?); they follow the cursor now"),
            Err(e) => tracing::debug!(transport = %self.name, error = %e,
                "adopting rows written without cursor=true failed"),
        }
    }
}

/// A cursor outbox's cursor, held by the session of [`CursorSource::acquire`]. Its calls are
/// not retried: an error may mean the session ended, and with it the lease.
struct SqlCursorLease {
    name: String,
    session: Box<dyn crate::backend::CursorSession>,
    position: CursorPosition,
}

#[async_trait]
impl CursorLease for SqlCursorLease {
    fn position(&self) -> CursorPosition {
        self.position
    }

    async fn advance(&mut self, to: CursorPosition) -> Result<(), TransportError> {
        let from = (self.position.major, self.position.minor);
        self.session
            .advance(from, (to.major, to.minor))
            .await
            .map_err(|e| match e {
                // Transient: the relay takes the cursor again and goes on from where it
                // stands now.
                sqlx::Error::RowNotFound => TransportError::new(
                    TransportErrorKind::Connection,
                    self.name.clone(),
                )
                .with_context(format!(
                    "the outbox cursor is no longer at {}.{} where this relay left it (reset by hand?): taking it again",
                    from.0, from.1
                )),
                e => transport_error(&self.name, "moving the outbox cursor", e),
            })?;
        self.position = to;
        Ok(())
    }

    async fn renew(&mut self) -> Result<(), TransportError> {
        self.session
            .renew()
            .await
            .map_err(|e| transport_error(&self.name, "renewing the outbox cursor's session", e))
    }
}

/// The error of a cursor call on a queue that is not a cursor outbox.
fn not_a_cursor(name: &str) -> TransportError {
    TransportError::new(TransportErrorKind::Unsupported, name.to_owned())
        .with_context("not a cursor outbox (cursor=true on PostgreSQL)")
}
