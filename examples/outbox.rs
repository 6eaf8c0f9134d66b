//! The transactional outbox and the inbox on one SQLite file, no server needed: orders are
//! written with their message in one transaction (one rolled back), a relay forwards the outbox
//! to an in-memory "broker", and a worker handles each order once, its effect and its inbox row
//! in one transaction, even when the relay sends a message twice.
//!
//! `cargo run --example outbox` (uses a temporary file)
use std::sync::Arc;

use courier::relay::{Relay, RelayOptions};
use courier::sql::{Inbox, InboxOptions, SqlTransport, dispatch_in};
use courier::{
    CancellationToken, Dsn, Envelope, Handler, HandlerError, HandlerResultExt, InMemoryTransport,
    Message, MessageBus, MessageRegistry, Transport, Worker, async_trait,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order: i64,
}

impl Message for OrderPlaced {
    const NAME: &'static str = "orders.placed";
}

struct Ship {
    pool: sqlx::SqlitePool,
    inbox: Inbox<sqlx::Sqlite>,
}

#[async_trait]
impl Handler<OrderPlaced> for Ship {
    async fn handle(&self, m: &OrderPlaced, envelope: &Envelope) -> Result<(), HandlerError> {
        let mut tx = self.pool.begin().await.recoverable()?;
        if !self.inbox.claim_in(&mut tx, envelope).await.recoverable()? {
            return Ok(()); // handled before
        }
        sqlx::query("INSERT INTO shipments (order_id) VALUES (?)")
            .bind(m.order)
            .execute(&mut *tx)
            .await
            .recoverable()?;
        tx.commit().await.recoverable()?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc")).await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE shipments (order_id INTEGER NOT NULL)")
        .execute(&pool)
        .await?;

    // The producer: the outbox is a SQL queue in the same database.
    let registry = Arc::new(MessageRegistry::new().with::<OrderPlaced>());
    let outbox = Arc::new(
        SqlTransport::connect(
            "outbox",
            &Dsn::parse(&format!("{url}?queue_name=outbox"))?,
            registry.clone(),
        )
        .await?,
    );
    let producer = MessageBus::builder()
        .transport("outbox", outbox.clone())
        .route("orders.*", ["outbox"])
        .build();
    for order in 1..=3 {
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id) VALUES (?)")
            .bind(order)
            .execute(&mut *tx)
            .await?;
        dispatch_in(&producer, &mut tx, OrderPlaced { order }).await?;
        if order == 2 {
            tx.rollback().await?; // neither the order nor its message
        } else {
            tx.commit().await?;
        }
    }

    // The relay: outbox -> broker (here in memory), then the same batch again, as after a
    // crash between the broker's confirmation and the outbox delete.
    let broker = Arc::new(InMemoryTransport::new());
    let relay = Relay::new("outbox", outbox.clone(), "broker", broker.clone())
        .options(RelayOptions::default().batch_size(10));
    relay.relay_batch().await?;
    let again: Vec<Envelope> = broker.sent();
    broker.send_batch(again).await?;

    // The consumer: the inbox skips what was handled; the handler claims in its transaction.
    let inbox = Inbox::new(pool.clone(), InboxOptions::new("shop_inbox")).await?;
    let consumer = MessageBus::builder()
        .middleware(inbox.clone())
        .handler(Ship {
            pool: pool.clone(),
            inbox,
        })
        .build();
    Worker::builder(consumer)
        .receiver("broker", broker.clone())
        .limit(4)
        .build()
        .run(CancellationToken::new())
        .await?;

    let shipped: Vec<i64> = sqlx::query_scalar("SELECT order_id FROM shipments ORDER BY order_id")
        .fetch_all(&pool)
        .await?;
    println!("shipped orders: {shipped:?}");
    assert_eq!(
        shipped,
        [1, 3],
        "each committed order once, the rolled-back one never"
    );
    Ok(())
}
