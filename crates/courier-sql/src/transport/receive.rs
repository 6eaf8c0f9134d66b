//! Receiving: claims within a poll window, waiting between them for a wake-up, the next due
//! time or an idle step.

use std::sync::Arc;
use std::time::Duration;

use courier_core::{Backoff, DeliveryTagStamp, Envelope, TransportError, TransportErrorKind};
use tokio::time::Instant;

use super::SqlTransport;

/// The longest pause between two polls of an idle queue when no server push is available.
const MAX_IDLE_BACKOFF: Duration = Duration::from_millis(250);
/// The first pause of an idle poll.
const FIRST_IDLE_BACKOFF: Duration = Duration::from_millis(5);
/// How long an empty `get` with live server push waits for a wake-up before it reads the next
/// due time (one statement).
const LISTEN_GRACE: Duration = Duration::from_millis(5);

/// The state of one poll window: its end, the wake-ups seen, the idle backoff.
pub(super) struct PollWindow {
    pub(super) deadline: Instant,
    pub(super) changes: tokio::sync::watch::Receiver<u64>,
    pub(super) idle: courier_core::Attempts,
    pub(super) grace_spent: bool,
}

impl SqlTransport {
    /// [`Transport::get`](courier_core::Transport::get), deleting `acks` in the first claim's
    /// transaction.
    pub(super) async fn get_after(
        &self,
        max: usize,
        mut acks: Vec<(i64, i64)>,
    ) -> Result<Vec<Envelope>, TransportError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if self.options.cursor {
            // A claim would take rows from under the cursor: the relay would skip them, and
            // the claimed ones would never be relayed.
            return Err(TransportError::new(TransportErrorKind::Unsupported, self.name.clone())
                .with_context("a cursor outbox (cursor=true) is read by `courier relay`, not by workers: consume the relay's destination, or open the queue without cursor=true"));
        }
        self.prune_keys_when_due().await;
        let mut window = self.poll_window();
        loop {
            window.changes.borrow_and_update();
            let claimed = self.claim_once(max, &acks).await?;
            acks.clear();
            if !claimed.is_empty() || !self.wait_for_more(&mut window).await? {
                return Ok(claimed);
            }
        }
    }

    /// The poll window of one `get` (or drain), starting now.
    pub(super) fn poll_window(&self) -> PollWindow {
        self.backend.start_listener(&self.wake);
        PollWindow {
            deadline: Instant::now() + self.options.poll_window,
            changes: self.wake.version.subscribe(),
            idle: Backoff::new(FIRST_IDLE_BACKOFF, MAX_IDLE_BACKOFF).attempts(),
            grace_spent: false,
        }
    }

    /// After an empty claim: waits until a row may be claimable (a wake-up, the next due time,
    /// an idle step); `false` once the window is over.
    pub(super) async fn wait_for_more(&self, w: &mut PollWindow) -> Result<bool, TransportError> {
        let now = Instant::now();
        if now >= w.deadline {
            return Ok(false);
        }
        let remaining = w.deadline - now;
        if self.wake.is_listening() && !w.grace_spent {
            // Server push is live: a message sent now wakes us by NOTIFY. The next due time
            // (a delayed row, an expired delivery) costs a statement, read only when no
            // wake-up comes within the grace: on a busy queue the next message usually
            // does, and the read would delay its claim. A row coming due meanwhile is
            // claimed at most the grace late.
            w.grace_spent = true;
            tokio::select! {
                () = tokio::time::sleep(LISTEN_GRACE.min(remaining)) => {}
                _ = w.changes.changed() => return Ok(true),
            }
            if Instant::now() >= w.deadline {
                return Ok(true);
            }
        }
        let remaining = w.deadline.saturating_duration_since(Instant::now());
        let due = self
            .attempt("reading the next due time", || self.backend.next_due_in())
            .await?;
        let until_due = due.map(|ms| Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0)));
        let wait = if self.wake.is_listening() && until_due.is_none_or(|d| !d.is_zero()) {
            // Server push is live: sleep until the next row is due, woken early by a NOTIFY.
            until_due.map_or(remaining, |d| d.min(remaining))
        } else {
            let step = w.idle.failed();
            until_due
                .filter(|d| !d.is_zero())
                .map_or(step, |d| d.min(step))
                .min(remaining)
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = w.changes.changed() => {}
        }
        Ok(true)
    }

    /// One claim; `acks` (id, delivery id) are deleted in the same transaction first.
    pub(super) async fn claim_once(
        &self,
        max: usize,
        acks: &[(i64, i64)],
    ) -> Result<Vec<Envelope>, TransportError> {
        let delivery_id = fastrand::i64(1..i64::MAX);
        let rows = if acks.is_empty() {
            self.attempt("claiming messages", || self.backend.claim(max, delivery_id))
                .await?
        } else {
            self.attempt("deleting and claiming messages", || {
                self.backend.delete_and_claim(acks, max, delivery_id)
            })
            .await?
        };
        // One tag for the whole claim: every row of it shares the delivery id.
        let tag = Arc::new(DeliveryTagStamp(delivery_id.to_string()));
        Ok(self
            .decode_all(rows)
            .map(|envelope| envelope.with_arc(Arc::clone(&tag)))
            .collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use courier_core::{Dsn, MessageRegistry, Transport, async_trait};

    use super::*;
    use crate::SqlOptions;
    use crate::backend::{Backend, NewRow, StoredRow, Wake};
    use crate::migrate::Applied;

    /// A queue whose first claim finds nothing and whose second finds one row, counting the
    /// next-due reads; it reports server push as live.
    #[derive(Debug, Default)]
    struct OneLate {
        claims: AtomicUsize,
        due_reads: AtomicUsize,
    }

    #[async_trait]
    impl Backend for Arc<OneLate> {
        async fn setup(&self) -> Result<Vec<Applied>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn dedup_take(&self, _: &str, _: i64) -> Result<bool, sqlx::Error> {
            Ok(true)
        }
        async fn dedup_release(&self, _: &str) -> Result<(), sqlx::Error> {
            Ok(())
        }
        async fn dedup_prune(&self, _: usize) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn insert_keyed(
            &self,
            _: &[NewRow],
            _: &[Option<(&str, i64)>],
        ) -> Result<Vec<Option<i64>>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert_keyed_in(
            &self,
            _: &mut (dyn std::any::Any + Send),
            _: &[NewRow],
            _: &[Option<(&str, i64)>],
        ) -> Result<Vec<Option<i64>>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert(&self, _: &[NewRow]) -> Result<Vec<i64>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn insert_in(
            &self,
            _: &mut (dyn std::any::Any + Send),
            _: &[NewRow],
        ) -> Result<Vec<i64>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn oldest_age_ms(&self) -> Result<Option<i64>, sqlx::Error> {
            Ok(None)
        }
        async fn claim(&self, _: usize, _: i64) -> Result<Vec<StoredRow>, sqlx::Error> {
            if self.claims.fetch_add(1, Ordering::SeqCst) == 0 {
                return Ok(Vec::new());
            }
            Ok(vec![StoredRow {
                id: 1,
                body: b"{}".to_vec(),
                headers: None,
                priority: 0,
                available_at: 0,
            }])
        }
        async fn delete_and_claim(
            &self,
            _: &[(i64, i64)],
            max: usize,
            delivery_id: i64,
        ) -> Result<Vec<StoredRow>, sqlx::Error> {
            self.claim(max, delivery_id).await
        }
        async fn next_due_in(&self) -> Result<Option<i64>, sqlx::Error> {
            self.due_reads.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
        async fn delete(&self, _: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn delete_one(&self, _: i64, _: i64) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn delete_ids(&self, _: &[i64]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn keepalive(&self, _: i64, _: i64) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn keepalive_many(&self, _: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn reschedule(&self, _: i64, _: i64, _: &NewRow) -> Result<u64, sqlx::Error> {
            Ok(0)
        }
        async fn list(&self, _: usize) -> Result<Vec<StoredRow>, sqlx::Error> {
            Ok(Vec::new())
        }
        async fn find(&self, _: i64) -> Result<Option<StoredRow>, sqlx::Error> {
            Ok(None)
        }
        async fn count(&self) -> Result<i64, sqlx::Error> {
            Ok(0)
        }
        fn start_listener(&self, wake: &Arc<Wake>) {
            wake.set_listening(true);
        }
        fn connection_ids(&self) -> Vec<u64> {
            Vec::new()
        }
        async fn explain(&self, e: sqlx::Error) -> sqlx::Error {
            e
        }
        fn workers(&self, _: &str, _: &str, _: Duration) -> Box<dyn courier_core::WorkerRegistry> {
            Box::new(courier_core::InMemoryWorkerRegistry::new())
        }
        async fn setup_workers(&self) -> Result<Vec<Applied>, sqlx::Error> {
            Ok(Vec::new())
        }
        fn schedules(&self, _: &str, _: &str) -> Box<dyn courier_core::ScheduleStore> {
            Box::new(courier_core::InMemoryScheduleStore::new())
        }
        fn pauses(&self, _: &str, _: &str) -> Box<dyn courier_core::Pausable> {
            Box::new(crate::paused::NeverPaused)
        }
        fn limits(&self, _: &str, _: &str) -> Box<dyn courier_core::RateLimiter> {
            Box::new(courier_core::MemoryRateLimiter::new())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_listening_get_woken_soon_after_an_empty_claim_reads_no_next_due_time() {
        let backend = Arc::new(OneLate::default());
        let transport = SqlTransport {
            name: "t".to_owned(),
            dsn: Dsn::parse("postgres://localhost/db").unwrap(),
            options: SqlOptions::default(),
            registry: Arc::new(MessageRegistry::new()),
            backend: Box::new(backend.clone()),
            workers: Box::new(courier_core::InMemoryWorkerRegistry::new()),
            schedules: Box::new(courier_core::InMemoryScheduleStore::new()),
            pauses: Box::new(crate::paused::NeverPaused),
            limits: Box::new(courier_core::MemoryRateLimiter::new()),
            wake: Wake::new(),
            applied: std::sync::Mutex::new(Vec::new()),
            strays_checked: std::sync::Mutex::new(Instant::now()),
            dedup_prune: crate::dedup::PruneClock::new(),
            shared_pool: None,
            schema_checked: None,
        };
        let wake = transport.wake.clone();
        let notify = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            wake.bump();
        };
        let (got, ()) = tokio::join!(transport.get(1), notify);
        assert_eq!(got.unwrap().len(), 1);
        assert_eq!(backend.claims.load(Ordering::SeqCst), 2);
        // The NOTIFY came within the grace: the claim it triggers is not queued behind a read.
        assert_eq!(backend.due_reads.load(Ordering::SeqCst), 0);
    }
}
