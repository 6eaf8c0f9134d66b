//! The outbox crash tests' consumer side: [`OutboxOrder`] and its handler, which writes its side
//! effect and claims the message id in the inbox in one PostgreSQL transaction (see the
//! `outbox-worker` binary).

use std::sync::atomic::{AtomicBool, Ordering};

use courier_core::relay::{RelayOptions, RelayPoint};
use courier_core::{Envelope, Handler, HandlerError, HandlerResultExt, Message, async_trait};
use courier_sql::{Inbox, InboxOptions};
use serde::{Deserialize, Serialize};

/// The message the outbox crash tests dispatch in a transaction.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutboxOrder {
    /// The order's id: committed ones are even.
    pub id: i64,
}

impl Message for OutboxOrder {
    const NAME: &'static str = "outbox.order";
}

/// What the handler needs, read from the environment before the runtime starts.
#[derive(Debug, Clone)]
pub struct OutboxSettings {
    db: String,
    effects: String,
    inbox: String,
    pause_after_commit: Option<std::path::PathBuf>,
}

impl OutboxSettings {
    /// From `OUTBOX_DB`, `OUTBOX_EFFECTS`, `OUTBOX_INBOX` and `OUTBOX_PAUSE_AFTER_COMMIT`.
    ///
    /// # Errors
    /// A missing variable or a bad table name.
    pub fn from_env() -> anyhow::Result<Self> {
        let var =
            |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} is not set"));
        let effects = var("OUTBOX_EFFECTS")?;
        anyhow::ensure!(
            courier_sql::is_valid_identifier(&effects),
            "OUTBOX_EFFECTS: invalid table name"
        );
        Ok(Self {
            db: var("OUTBOX_DB")?,
            effects,
            inbox: var("OUTBOX_INBOX")?,
            pause_after_commit: std::env::var_os("OUTBOX_PAUSE_AFTER_COMMIT").map(Into::into),
        })
    }

    /// The handler, on a lazily connecting pool (call it inside the runtime).
    ///
    /// # Errors
    /// A bad database URL or inbox name.
    pub fn handler(&self) -> anyhow::Result<OutboxHandler> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy(&self.db)?;
        let inbox = Inbox::without_setup(pool.clone(), InboxOptions::new(&self.inbox))?;
        Ok(OutboxHandler {
            pool,
            inbox,
            effects: self.effects.clone(),
            pause_after_commit: self.pause_after_commit.clone(),
            paused: std::sync::Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Records each order once: effect row + inbox claim in one transaction.
#[derive(Debug, Clone)]
pub struct OutboxHandler {
    pool: sqlx::PgPool,
    inbox: Inbox<sqlx::Postgres>,
    effects: String,
    pause_after_commit: Option<std::path::PathBuf>,
    paused: std::sync::Arc<AtomicBool>,
}

impl OutboxHandler {
    /// The inbox, for the bus's middleware.
    #[must_use]
    pub fn inbox(&self) -> Inbox<sqlx::Postgres> {
        self.inbox.clone()
    }
}

#[async_trait]
impl Handler<OutboxOrder> for OutboxHandler {
    async fn handle(&self, order: &OutboxOrder, envelope: &Envelope) -> Result<(), HandlerError> {
        let mut tx = self.pool.begin().await.recoverable()?;
        if !self.inbox.claim_in(&mut tx, envelope).await.recoverable()? {
            return Ok(());
        }
        sqlx::query(&format!(
            "INSERT INTO {} (order_id) VALUES ($1)",
            self.effects
        ))
        .bind(order.id)
        .execute(&mut *tx)
        .await
        .recoverable()?;
        tx.commit().await.recoverable()?;
        if let Some(file) = &self.pause_after_commit
            && !self.paused.swap(true, Ordering::SeqCst)
        {
            std::fs::write(file, std::process::id().to_string()).recoverable()?;
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// Where the crash tests stop a relay (the `outbox-worker` binary's fault point; the `courier`
/// binary has none): at [`RelayPoint`] `point` of its first batch it writes its process id to
/// `file`, then waits forever, to be killed there.
#[derive(Debug, Clone)]
pub struct RelayPause {
    point: RelayPoint,
    file: std::path::PathBuf,
}

impl RelayPause {
    /// From `OUTBOX_RELAY_PAUSE` (`after_confirm` or `after_delete`) and
    /// `OUTBOX_RELAY_PAUSE_FILE`; `None` when the first is not set.
    ///
    /// # Errors
    /// An unknown point, or no file to write.
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        let Ok(point) = std::env::var("OUTBOX_RELAY_PAUSE") else {
            return Ok(None);
        };
        let point = point
            .parse()
            .map_err(|e: String| anyhow::anyhow!("OUTBOX_RELAY_PAUSE: {e}"))?;
        let file = std::env::var_os("OUTBOX_RELAY_PAUSE_FILE")
            .ok_or_else(|| anyhow::anyhow!("OUTBOX_RELAY_PAUSE needs OUTBOX_RELAY_PAUSE_FILE"))?;
        Ok(Some(Self {
            point,
            file: file.into(),
        }))
    }

    /// `options` with the pause installed as their
    /// [`on_point`](RelayOptions::on_point) probe.
    #[must_use]
    pub fn apply(&self, options: RelayOptions) -> RelayOptions {
        let pause = self.clone();
        let reached = std::sync::Arc::new(AtomicBool::new(false));
        options.on_point(move |at| {
            let stop = at == pause.point && !reached.swap(true, Ordering::SeqCst);
            let file = pause.file.clone();
            async move {
                if !stop {
                    return;
                }
                if let Err(e) = std::fs::write(&file, std::process::id().to_string()) {
                    eprintln!("outbox-worker: cannot write {}: {e}", file.display());
                }
                std::future::pending::<()>().await;
            }
        })
    }
}
