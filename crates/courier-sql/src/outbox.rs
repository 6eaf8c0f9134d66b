//! [`dispatch_in`]: a dispatch written through the caller's own database transaction, so the
//! message exists exactly when the business transaction commits (the transactional outbox).
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier_core::{Dsn, Message, MessageBus, MessageRegistry};
//! use courier_sql::{SqlTransport, dispatch_in};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order: i64 }
//! impl Message for OrderPlaced { const NAME: &'static str = "orders.placed"; }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = Arc::new(MessageRegistry::new().with::<OrderPlaced>());
//! let dsn = Dsn::parse("postgres://app@db/shop?queue_name=outbox")?;
//! let outbox = SqlTransport::connect("outbox", &dsn, registry).await?;
//! let bus = MessageBus::builder()
//!     .transport("outbox", Arc::new(outbox))
//!     .route("orders.*", ["outbox"])
//!     .build();
//!
//! let pool = sqlx::PgPool::connect("postgres://app@db/shop").await?;
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
//! dispatch_in(&bus, &mut tx, OrderPlaced { order: 42 }).await?;
//! tx.commit().await?;              // the order and its message, or neither
//! # Ok(()) }
//! ```
//!
//! The queue may be consumed directly (`courier consume outbox`) or relayed elsewhere
//! (`courier relay --from outbox --to amqp_orders`, see
//! [`courier_core::relay`]).

use courier_core::{
    BusError, DeduplicatedStamp, Envelope, MessageBus, SentStamp, TransportError,
    TransportErrorKind, TransportMessageIdStamp,
};

use crate::{SqlDatabase, SqlTransport};

/// Dispatches `message` on `bus` and writes what it routes to SQL transports through `tx`,
/// instead of sending it: the rows are committed or rolled back with the caller's transaction.
/// The bus runs its chain as for [`MessageBus::dispatch`] (bus name, a fresh
/// [`MessageIdStamp`](courier_core::MessageIdStamp), middleware, signing, `on_send` hooks);
/// see [`MessageBus::prepare`]. Returns the dispatched envelope with each row's
/// [`TransportMessageIdStamp`].
///
/// Every transport the message is routed to must be a [`SqlTransport`] on the same kind of
/// database as `tx` (the same database, for the guarantee to mean anything): route to an
/// outbox queue and relay it to a broker.
///
/// A [`DeduplicateStamp`](courier_core::DeduplicateStamp)'s key is taken through `tx` too, in
/// `<table>_dedup` beside the row: it commits with the message or rolls back with it, so after a
/// rollback the same key dispatches again at once. Until `tx` ends, another transaction taking
/// the same key waits for it (PostgreSQL, MySQL; on SQLite the open transaction holds the write
/// lock). When the key is held, nothing is written for that transport and the returned envelope
/// carries a [`DeduplicatedStamp`] for it instead of a [`SentStamp`].
///
/// # Errors
/// [`BusError::NotRouted`] for a message routed nowhere, [`BusError::Send`] naming a routed
/// transport that is not SQL or whose database differs from `tx`'s, or the insert's error; what
/// the chain returns. The transaction is left to the caller (roll it back on error).
pub async fn dispatch_in<DB>(
    bus: &MessageBus,
    tx: &mut sqlx::Transaction<'_, DB>,
    message: impl Into<Envelope>,
) -> Result<Envelope, BusError>
where
    DB: SqlDatabase,
    DB::Connection: 'static,
{
    let prepared = bus.prepare(message).await?;
    let mut envelope = prepared.envelope;
    let name = envelope.message_name().to_owned();
    let send_error = |source: TransportError| BusError::Send {
        name: name.clone(),
        source,
    };
    for (transport, outgoing) in prepared.sends {
        let sql = bus
            .transport(&transport)
            .and_then(|t| t.as_any())
            .and_then(|t| t.downcast_ref::<SqlTransport>())
            .ok_or_else(|| {
                send_error(
                    TransportError::new(TransportErrorKind::Unsupported, transport.clone())
                        .with_context(
                            "not a SQL transport: only SQL transports can be written in a transaction (route to an outbox queue and relay it)",
                        ),
                )
            })?;
        let deduplicated_before = outgoing.all::<DeduplicatedStamp>().count();
        let written = sql.send_in(tx, vec![outgoing]).await.map_err(send_error)?;
        let Some(written) = written.first() else {
            continue;
        };
        if written.all::<DeduplicatedStamp>().count() > deduplicated_before
            && let Some(deduplicated) = written.last::<DeduplicatedStamp>()
        {
            envelope = not_sent_to(envelope, &transport).with(deduplicated.clone());
            continue;
        }
        if let Some(id) = written.last::<TransportMessageIdStamp>() {
            envelope = envelope.with(id.clone());
        }
    }
    Ok(envelope)
}

/// The envelope without the [`SentStamp`] of `transport` (its key was held: nothing written).
fn not_sent_to(envelope: Envelope, transport: &str) -> Envelope {
    let others: Vec<SentStamp> = envelope
        .all::<SentStamp>()
        .filter(|s| s.transport != transport)
        .cloned()
        .collect();
    others
        .into_iter()
        .fold(envelope.without_all::<SentStamp>(), Envelope::with)
}
