//! Sending: the rows of envelopes to insert (encoding, delay, priority, concurrency key), and
//! the insert through the caller's transaction.

use std::time::Duration;

use courier_core::{
    DelayStamp, Envelope, PriorityStamp, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp,
};

use super::SqlTransport;
use super::dedup::key_refs;
use crate::Dialect;
use crate::backend::NewRow;

impl SqlTransport {
    pub(super) fn new_row(
        &self,
        envelope: &Envelope,
        delay: Duration,
    ) -> Result<NewRow, TransportError> {
        let encoded =
            courier_core::encode_json_with(envelope, self.options.serializer).map_err(|e| {
                TransportError::new(TransportErrorKind::Encode, self.name.clone())
                    .with_context("encoding")
                    .with_source(e)
            })?;
        Ok(NewRow {
            body: encoded.body,
            headers: encoded.headers,
            priority: i16::from(envelope.last::<PriorityStamp>().map_or(0, |p| p.0)),
            delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 4),
            key: None,
        })
    }

    /// A message's concurrency key on a queue with flow control: its
    /// [`ConcurrencyKeyStamp`](courier_core::ConcurrencyKeyStamp) (checked again: 1 to 200
    /// bytes), else the body field `concurrency_key` names. A message whose field is missing
    /// or not a string is refused, naming the path and the message.
    pub(super) fn concurrency_key(
        &self,
        envelope: &Envelope,
        body: &str,
    ) -> Result<Option<String>, TransportError> {
        if !self.options.keyed() {
            return Ok(None);
        }
        let refuse = |reason: String| {
            TransportError::new(TransportErrorKind::Encode, self.name.clone())
                .with_context(format!("message {}: {reason}", envelope.message_name()))
        };
        if let Some(stamp) = envelope.last::<courier_core::ConcurrencyKeyStamp>() {
            let key = courier_core::ConcurrencyKeyStamp::new(stamp.as_str())
                .map_err(|e| refuse(e.to_string()))?;
            return Ok(Some(String::from(key)));
        }
        match &self.options.concurrency_key {
            Some(path) => path
                .find(body)
                .map(|key| Some(String::from(key)))
                .map_err(refuse),
            None => Ok(None),
        }
    }

    /// The rows of envelopes to insert (delay and priority from their stamps).
    pub(super) fn rows(&self, envelopes: &[Envelope]) -> Result<Vec<NewRow>, TransportError> {
        let caps = self.capabilities();
        let mut rows = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            caps.check_delay(&self.name, envelope)?;
            let delay = envelope
                .last::<DelayStamp>()
                .map_or(Duration::ZERO, |d| d.0);
            let mut row = self.new_row(envelope, delay)?;
            row.key = self.concurrency_key(envelope, &row.body)?;
            rows.push(row);
        }
        Ok(rows)
    }

    /// The envelopes with the ids their rows got.
    pub(super) fn with_ids(
        &self,
        envelopes: Vec<Envelope>,
        ids: Vec<i64>,
    ) -> Result<Vec<Envelope>, TransportError> {
        if ids.len() != envelopes.len() {
            return Err(
                TransportError::new(TransportErrorKind::Protocol, self.name.clone()).with_context(
                    format!(
                        "inserted {} rows for {} messages",
                        ids.len(),
                        envelopes.len()
                    ),
                ),
            );
        }
        Ok(envelopes
            .into_iter()
            .zip(ids)
            .map(|(e, id)| e.with(TransportMessageIdStamp(id.to_string())))
            .collect())
    }

    /// The dialect of the DSN.
    pub(super) fn dialect(&self) -> Option<Dialect> {
        Dialect::from_scheme(self.dsn.scheme()).ok()
    }

    /// Writes envelopes as rows of this transport's table and queue through the caller's
    /// transaction, so that they exist exactly when it commits: the same insert as
    /// [`send_batch`](Transport::send_batch), on the caller's connection (the transaction may
    /// come from any pool on the same database). Returns them with their row ids. Nothing is
    /// retried here (a failed statement spoils the transaction: the caller decides); on
    /// PostgreSQL the consumers' wake-up `NOTIFY` is delivered at commit. Prefer
    /// [`dispatch_in`](crate::dispatch_in), which routes the message first.
    ///
    /// # Errors
    /// [`TransportErrorKind::Config`] when the transaction is on another kind of database than
    /// this transport's; an encoding error; the database error.
    pub async fn send_in<DB>(
        &self,
        tx: &mut sqlx::Transaction<'_, DB>,
        envelopes: Vec<Envelope>,
    ) -> Result<Vec<Envelope>, TransportError>
    where
        DB: crate::SqlDatabase,
        DB::Connection: 'static,
    {
        if self.dialect() != Some(DB::DIALECT) {
            return Err(
                TransportError::new(TransportErrorKind::Config, self.name.clone()).with_context(
                    format!(
                        "a {:?} transaction cannot write to this transport's `{}` database",
                        DB::DIALECT,
                        self.dsn.scheme()
                    ),
                ),
            );
        }
        if envelopes.is_empty() {
            return Ok(envelopes);
        }
        let rows = self.rows(&envelopes)?;
        let conn: &mut DB::Connection = tx;
        if let Some(keys) = self.dedup_keys(&envelopes)? {
            let ids = self
                .backend
                .insert_keyed_in(conn, &rows, &key_refs(&keys))
                .await
                .map_err(|e| {
                    self.error(
                        "inserting messages and taking their deduplication keys in a transaction",
                        e,
                    )
                })?;
            if ids.iter().any(Option::is_some) {
                self.wake.bump();
            }
            return self.with_keyed_ids(envelopes, ids, &keys);
        }
        let ids = self
            .backend
            .insert_in(conn, &rows)
            .await
            .map_err(|e| self.error("inserting messages in a transaction", e))?;
        self.wake.bump();
        self.with_ids(envelopes, ids)
    }
}
