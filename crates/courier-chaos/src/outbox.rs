//! The outbox crash tests' consumer side: [`OutboxOrder`] and its handler, which writes its side
//! effect and claims the message id in the inbox in one PostgreSQL transaction (see the
//! `outbox-worker` binary).

use std::sync::atomic::{AtomicBool, Ordering};

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
