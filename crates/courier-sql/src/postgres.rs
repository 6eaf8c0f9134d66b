//! PostgreSQL: batch writes through `UNNEST` arrays (one prepared statement whatever the batch
//! size), and `LISTEN`/`NOTIFY` wake-ups: every insert and retry notifies the channel named
//! after the table with the queue name as payload, and a listener task per transport wakes the
//! consumers of that queue.

mod flow;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use courier_core::{Backoff, TransportError};

use crate::relay::DrainHold;
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool};
use tokio::task::JoinHandle;

use crate::backend::{NewRow, StoredRow, Wake, sort_claimed};
use crate::error::transport_error;
use crate::messages::{MessageDialect, Messages};
use crate::pool::{Hidden, PoolSettings, explain_timeout, postgres_pool};
use crate::{Dialect, SqlOptions};

/// What PostgreSQL keeps beside its pool.
#[derive(Debug)]
pub(crate) struct PgState {
    /// How connections open, for [`MessageDialect::explain`].
    connect: Hidden<PgConnectOptions>,
    listener: Mutex<Option<JoinHandle<()>>>,
    insert: String,
    /// `head WHERE` (id, delivery) pairs given as two arrays.
    pairs: String,
    /// The common case: every delivery of one claim shares its delivery id.
    same_delivery: String,
    /// A cursor outbox's statements (`cursor=true`).
    cursor: Option<CursorSql>,
    /// Whether a `LISTEN` task wakes consumers (`listen=true`), or they poll.
    listen: bool,
}

impl Drop for PgState {
    fn drop(&mut self) {
        if let Some(task) = self
            .listener
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// The statements of a cursor outbox (see [`CursorSource`](crate::relay::CursorSource)): rows are ordered by
/// `(relay_tx, id)`, the writing transaction's id then the row's.
#[derive(Debug)]
struct CursorSql {
    adopt: String,
    /// Takes the cursor's lock in the holder's session (binds: table, queue): a lock of the
    /// session, so it ends with the session, at once when the holder's process dies.
    lock: &'static str,
    take: String,
    read: String,
    advance: Arc<str>,
}

impl CursorSql {
    fn new(t: &str) -> Self {
        let c = format!("{t}_cursors");
        let r = |sql: String| Dialect::Postgres.render(&sql);
        Self {
            // The current transaction's id is newer than any a cursor has passed (those were
            // all older than the oldest transaction running when they were read). Adopted: rows
            // without an id (written without cursor=true), and rows whose id this cluster has
            // not reached (restored from another cluster's dump: the cursor would wait for
            // them for as many transactions).
            adopt: r(format!(
                "UPDATE {t} SET relay_tx = pg_current_xact_id()::text::bigint \
                 WHERE queue_name = $1 AND (relay_tx IS NULL \
                 OR relay_tx > pg_current_xact_id()::text::bigint)"
            )),
            lock: "SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))",
            // A cursor past this cluster's transaction ids (restored from another cluster's
            // dump) starts again from the beginning: its rows were adopted on connecting.
            take: r(format!(
                "INSERT INTO {c} (queue_name, tx, id, owner, moved_at) \
                 VALUES ($1, 0, 0, $2, {{now}}) \
                 ON CONFLICT (queue_name) DO UPDATE SET owner = EXCLUDED.owner, \
                 tx = CASE WHEN {c}.tx > pg_current_xact_id()::text::bigint THEN 0 ELSE {c}.tx END, \
                 id = CASE WHEN {c}.tx > pg_current_xact_id()::text::bigint THEN 0 ELSE {c}.id END \
                 RETURNING tx, id"
            )),
            // Only rows of transactions older than every one still running: none can appear
            // before them any more, so the cursor never passes a row committed late.
            read: r(format!(
                "SELECT id, body, headers, priority, available_at, relay_tx, \
                 available_at - {{now}} AS delay_left FROM {t} \
                 WHERE queue_name = $1 AND relay_tx IS NOT NULL AND (relay_tx, id) > ($2, $3) \
                 AND relay_tx < pg_snapshot_xmin(pg_current_snapshot())::text::bigint \
                 ORDER BY relay_tx, id LIMIT $4"
            )),
            // The rows between the old position ($4, $5) and the new ($2, $3) go with the
            // move, in one statement, and only if the cursor stood at the old position. The
            // range is given as values, not joined from the cursor's row: the planner then
            // walks the index over the batch instead of scanning the whole backlog per move.
            advance: Arc::from(r(format!(
                "WITH moved AS (UPDATE {c} SET tx = $2, id = $3, moved_at = {{now}} \
                 WHERE queue_name = $1 AND tx = $4 AND id = $5 RETURNING 1), \
                 gone AS (DELETE FROM {t} m WHERE m.queue_name = $1 \
                 AND m.relay_tx IS NOT NULL AND (m.relay_tx, m.id) > ($4, $5) \
                 AND (m.relay_tx, m.id) <= ($2, $3) AND EXISTS (SELECT 1 FROM moved)) \
                 SELECT count(*) FROM moved"
            ))),
        }
    }
}

/// The session that holds a cursor outbox's cursor.
struct PgCursorSession {
    conn: PgConnection,
    queue: String,
    advance: Arc<str>,
}

#[async_trait]
impl crate::backend::CursorSession for PgCursorSession {
    async fn advance(&mut self, from: (i64, i64), to: (i64, i64)) -> Result<(), sqlx::Error> {
        use sqlx::Connection as _;
        // Losing this commit in a server crash moves the cursor back with its deletes: the
        // destination gets those messages again (at least once), so it need not wait for the
        // disk.
        let mut tx = self
            .conn
            .begin_with("BEGIN; SET LOCAL synchronous_commit TO OFF")
            .await?;
        let moved: i64 = sqlx::query_scalar(&self.advance)
            .bind(&self.queue)
            .bind(to.0)
            .bind(to.1)
            .bind(from.0)
            .bind(from.1)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        if moved == 0 {
            // Only this session moves the cursor while it holds the lock: someone reset or
            // deleted its row by hand.
            return Err(sqlx::Error::RowNotFound);
        }
        Ok(())
    }

    async fn renew(&mut self) -> Result<(), sqlx::Error> {
        use sqlx::Connection as _;
        self.conn.ping().await
    }
}

pub(crate) async fn connect(url: &str, o: &SqlOptions) -> Result<Messages<Postgres>, sqlx::Error> {
    let (pool, connect) = postgres_pool(url, &PoolSettings::from(o)).await?;
    Ok(on_pool(pool, connect, o))
}

/// The message table on the application's pool (its connect options explain a timeout).
pub(crate) fn from_pool(pool: PgPool, o: &SqlOptions) -> Messages<Postgres> {
    let connect = (*pool.connect_options()).clone();
    on_pool(pool, connect, o)
}

fn on_pool(pool: PgPool, connect: PgConnectOptions, o: &SqlOptions) -> Messages<Postgres> {
    let t = &o.table_name;
    // A cursor outbox's rows record the transaction that wrote them.
    let (tx_column, tx_value) = if o.cursor {
        (", relay_tx", ", pg_current_xact_id()::text::bigint")
    } else {
        ("", "")
    };
    // A queue with flow control writes each row's concurrency key (`$7`, one per row).
    let (key_column, key_value, key_array, key_name) = if o.keyed() {
        (", concurrency_key", ", x.ckey", ", $7::TEXT[]", ", ckey")
    } else {
        ("", "", "", "")
    };
    let state = PgState {
        cursor: o.cursor.then(|| CursorSql::new(t)),
        connect: Hidden(connect),
        listener: Mutex::new(None),
        listen: o.listen,
        insert: Dialect::Postgres.render(&format!(
            "WITH ins AS (\
             INSERT INTO {t} (queue_name, body, headers, priority, created_at, available_at{tx_column}{key_column}) \
             SELECT $1, x.body, x.headers, x.priority, {{now}}, {{now}} + x.delay{tx_value}{key_value} \
             FROM UNNEST($2::TEXT[], $3::TEXT[], $4::INT2[], $5::INT8[]{key_array}) WITH ORDINALITY \
             AS x(body, headers, priority, delay{key_name}, ord) ORDER BY x.ord RETURNING id), \
             wake AS (SELECT pg_notify($6, $1)) \
             SELECT array_agg(ins.id ORDER BY ins.id) FROM ins CROSS JOIN wake"
        )),
        pairs: " WHERE (id, delivery_id) IN (SELECT * FROM UNNEST($1::INT8[], $2::INT8[]))"
            .to_owned(),
        same_delivery: " WHERE id = ANY($1) AND delivery_id = $2".to_owned(),
    };
    Messages::new(pool, o, state)
}

/// How a drain's transaction begins, in one round trip: its commit does not wait for the disk
/// (see `drain` below), and the server ends it once it sat idle `hold_for` (at least 1 ms; 0
/// would mean never), so a relay cut off from the server does not keep its rows locked until
/// TCP gives up on the connection (hours).
fn drain_begin(hold_for: std::time::Duration) -> String {
    let idle_ms = hold_for.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "BEGIN; SET LOCAL synchronous_commit TO OFF; \
         SET LOCAL idle_in_transaction_session_timeout = {idle_ms}"
    )
}

/// The open transaction of a drained batch: committing deletes its rows for good, dropping it
/// rolls back (sqlx rolls an open transaction back when it is dropped).
struct Held {
    name: String,
    tx: sqlx::Transaction<'static, Postgres>,
}

#[async_trait]
impl DrainHold for Held {
    async fn commit(self: Box<Self>) -> Result<(), TransportError> {
        let Self { name, tx } = *self;
        let statement = crate::pool::InFlight::start();
        let committed = tx.commit().await;
        statement.done();
        committed.map_err(|e| transport_error(&name, "committing a drained batch", e))
    }
}

/// Keeps a `LISTEN` on `channel` alive, bumping `wake` for each notification about `queue`
/// (and once after every (re)connect, since notifications may have been missed meanwhile).
/// While it is down, `wake.listening` is false and consumers poll.
async fn listen(pool: PgPool, channel: String, queue: String, wake: Arc<Wake>) {
    let mut waits = Backoff::new(Duration::from_millis(50), Duration::from_secs(5)).attempts();
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                wake.set_listening(false);
                tracing::debug!(error = %e, "LISTEN failed; consumers poll until it is back");
                tokio::time::sleep(waits.failed()).await;
                continue;
            }
        };
        waits.succeeded();
        wake.set_listening(true);
        wake.bump();
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.payload() == queue => wake.bump(),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // The connection dropped: notifications may be lost, so poll until relistening.
                    wake.set_listening(false);
                    wake.bump();
                    tracing::debug!("LISTEN connection lost; reconnecting");
                    break;
                }
            }
        }
    }
}

#[async_trait]
impl crate::backend::CursorRows for Messages<Postgres> {
    async fn adopt(&self) -> Result<u64, sqlx::Error> {
        let Some(sql) = &self.state.cursor else {
            return Ok(0);
        };
        let done = sqlx::query(&sql.adopt)
            .bind(&self.queue)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn acquire(
        &self,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<(Box<dyn crate::backend::CursorSession>, (i64, i64))>, sqlx::Error> {
        use sqlx::Connection as _;
        let Some(sql) = &self.state.cursor else {
            return Ok(None);
        };
        let mut conn = PgConnection::connect_with(&self.state.connect.0).await?;
        // A holder cut off from the server (a partition, a frozen host) cannot close its
        // session, and the server would wait for TCP to give up (hours): it ends the session
        // itself once it sits silent a lease, and the cursor is free for another relay.
        let ms = lease.as_millis().clamp(1, i32::MAX as u128);
        // The session only moves the cursor: each move deletes one batch's range of the
        // index, planned with its values (a generic plan guesses a range too wide for the
        // index and scans the whole backlog), never a sequential scan of it.
        let settings = format!(
            "SET idle_in_transaction_session_timeout = {ms}; \
             SET plan_cache_mode = force_custom_plan; SET enable_seqscan = off"
        );
        sqlx::Executor::execute(&mut conn, sqlx::raw_sql(&settings)).await?;
        let idle = format!("SET idle_session_timeout = {ms}");
        if let Err(e) = sqlx::Executor::execute(&mut conn, sqlx::raw_sql(&idle)).await {
            // Before PostgreSQL 14: a silent holder keeps the cursor until TCP gives up.
            tracing::debug!(error = %e, "idle_session_timeout not set on the cursor's session");
        }
        let locked: bool = sqlx::query_scalar(sql.lock)
            .bind(&self.table)
            .bind(&self.queue)
            .fetch_one(&mut conn)
            .await?;
        if !locked {
            let _ = conn.close().await;
            return Ok(None);
        }
        let at: (i64, i64) = sqlx::query_as(&sql.take)
            .bind(&self.queue)
            .bind(owner)
            .fetch_one(&mut conn)
            .await?;
        let session = PgCursorSession {
            conn,
            queue: self.queue.clone(),
            advance: Arc::clone(&sql.advance),
        };
        Ok(Some((Box::new(session), at)))
    }

    async fn read(
        &self,
        after: (i64, i64),
        max: usize,
    ) -> Result<Vec<(StoredRow, i64, i64)>, sqlx::Error> {
        use sqlx::{FromRow as _, Row as _};
        let Some(sql) = &self.state.cursor else {
            return Ok(Vec::new());
        };
        let rows = sqlx::query(&sql.read)
            .bind(&self.queue)
            .bind(after.0)
            .bind(after.1)
            .bind(i64::try_from(max).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    StoredRow::from_row(row)?,
                    row.try_get("relay_tx")?,
                    row.try_get::<Option<i64>, _>("delay_left")?.unwrap_or(0),
                ))
            })
            .collect()
    }
}

#[async_trait]
impl MessageDialect for Postgres {
    type State = PgState;

    fn cursor(m: &Messages<Self>) -> Option<&dyn crate::backend::CursorRows> {
        m.state
            .cursor
            .is_some()
            .then_some(m as &dyn crate::backend::CursorRows)
    }

    async fn insert(
        m: &Messages<Self>,
        conn: &mut PgConnection,
        rows: &[NewRow],
    ) -> Result<Vec<i64>, sqlx::Error> {
        let bodies: Vec<&str> = rows.iter().map(|r| r.body.as_str()).collect();
        let headers: Vec<&str> = rows.iter().map(|r| r.headers.as_str()).collect();
        let priorities: Vec<i16> = rows.iter().map(|r| r.priority).collect();
        let delays: Vec<i64> = rows.iter().map(|r| r.delay_ms).collect();
        let keys: Vec<Option<&str>> = rows.iter().map(|r| r.key.as_deref()).collect();
        // One row back, the ids as one array, rather than a row per message.
        let q = sqlx::query_scalar(&m.state.insert)
            .bind(&m.queue)
            .bind(bodies)
            .bind(headers)
            .bind(priorities)
            .bind(delays)
            .bind(&m.table);
        let ids: Option<Vec<i64>> = if m.flow.is_some() {
            q.bind(keys).fetch_one(&mut *conn).await?
        } else {
            q.fetch_one(&mut *conn).await?
        };
        // Ids come from one sequence in insertion order.
        Ok(ids.unwrap_or_default())
    }

    async fn delete_and_claim(
        m: &Messages<Self>,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Option<Result<Vec<StoredRow>, sqlx::Error>> {
        let sql = m.sql.delete_and_claim.as_deref()?;
        let (ids, tags): (Vec<i64>, Vec<i64>) = deliveries.iter().copied().unzip();
        Some(
            sqlx::query_as(sql)
                .bind(ids)
                .bind(tags)
                .bind(&m.queue)
                .bind(m.redeliver_ms)
                .bind(i64::try_from(max).unwrap_or(i64::MAX))
                .bind(delivery_id)
                .fetch_all(&m.pool)
                .await,
        )
    }

    async fn drain(
        m: &Messages<Self>,
        name: &str,
        max: usize,
        hold_for: std::time::Duration,
        held: &tokio::sync::Notify,
    ) -> Option<Result<(Vec<StoredRow>, Box<dyn DrainHold>), sqlx::Error>> {
        let (lock, take) = (m.sql.drain.as_deref()?, m.sql.drain_take.as_deref()?);
        let drained = async {
            // The commit only deletes rows the destination confirmed already: should the
            // server lose it in a crash, those messages are relayed again (at least once, as
            // after a relay crash), so it need not wait for the WAL to reach the disk. On a
            // disk that syncs in ~3 ms, that wait was the relay's pace at batch 64.
            let mut tx = m.pool.begin_with(drain_begin(hold_for)).await?;
            let ids: Vec<i64> = sqlx::query_scalar(lock)
                .bind(&m.queue)
                .bind(m.redeliver_ms)
                .bind(i64::try_from(max).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            let mut rows: Vec<StoredRow> = if ids.is_empty() {
                // Nothing held, nothing told: a drain started beside one waiting for the first
                // row could take it, and with it the queue's head, out of order.
                Vec::new()
            } else {
                // Locked: a drain that starts now skips these rows and takes those behind.
                held.notify_one();
                sqlx::query_as(take).bind(ids).fetch_all(&mut *tx).await?
            };
            sort_claimed(&mut rows);
            let hold = Held {
                name: name.to_owned(),
                tx,
            };
            Ok::<_, sqlx::Error>((rows, Box::new(hold) as Box<dyn DrainHold>))
        };
        Some(drained.await)
    }

    async fn for_deliveries(
        m: &Messages<Self>,
        conn: &mut PgConnection,
        head: &str,
        deliveries: &[(i64, i64)],
    ) -> Option<Result<u64, sqlx::Error>> {
        let ids: Vec<i64> = deliveries.iter().map(|d| d.0).collect();
        let q = match deliveries.first() {
            Some(&(_, tag)) if deliveries.iter().all(|d| d.1 == tag) => {
                let sql = format!("{head}{}", m.state.same_delivery);
                sqlx::query(&sql).bind(ids).bind(tag).execute(conn).await
            }
            _ => {
                let tags: Vec<i64> = deliveries.iter().map(|d| d.1).collect();
                let sql = format!("{head}{}", m.state.pairs);
                sqlx::query(&sql).bind(ids).bind(tags).execute(conn).await
            }
        };
        Some(q.map(|done| done.rows_affected()))
    }

    async fn flow_claim(
        m: &Messages<Self>,
        deliveries: &[(i64, i64)],
        max: usize,
        delivery_id: i64,
    ) -> Option<Result<Vec<StoredRow>, sqlx::Error>> {
        flow::claim(m, deliveries, max, delivery_id).await
    }

    fn start_listener(m: &Messages<Self>, wake: &Arc<Wake>) {
        if !m.state.listen {
            return;
        }
        // The listener holds a session of the pool for good: in a pool of one it would leave
        // nothing to claim with (every claim timed out waiting for a session), so consumers poll.
        if m.pool.options().get_max_connections() < 2 {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    queue = %m.queue,
                    "a PostgreSQL pool of one connection: consumers poll instead of LISTEN \
                     (a pool of two or more wakes them at once)"
                );
            });
            return;
        }
        let mut task = m.state.listener.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            let span = tracing::debug_span!("courier.sql.listen", messaging.system = "postgresql", messaging.destination.name = %m.queue);
            *task = Some(tokio::spawn(tracing::Instrument::instrument(
                listen(
                    m.pool.clone(),
                    m.table.clone(),
                    m.queue.clone(),
                    wake.clone(),
                ),
                span,
            )));
        }
    }

    async fn explain(m: &Messages<Self>, e: sqlx::Error) -> sqlx::Error {
        explain_timeout::<PgConnection>(&m.state.connect.0, e).await
    }
}
