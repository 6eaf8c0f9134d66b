//! Courier interop with [Symfony Messenger](https://symfony.com/doc/current/messenger.html):
//! consume and produce Symfony's own messages, so PHP and Rust workers can share queues while
//! message types move to Rust one at a time.
//!
//! - [`SymfonySerializer`]: Symfony's JSON `Serializer` format (the body as JSON with PHP's
//!   property names, the PHP class in `type`, `X-Message-Stamp-<FQCN>` stamp headers), mapped
//!   to Courier's messages by [`SymfonyTypes`]; it also reads `PhpSerializer` envelopes (never
//!   writes them).
//! - `DoctrineTransport` (feature `sql` with `postgres`, `sqlite` or `mysql`): Symfony's
//!   Doctrine table `messenger_messages`, read and written as PHP does, so that PHP and Courier
//!   workers consume one queue together. `SymfonyTransportFactory` builds it from a
//!   `symfony+postgres://`, `symfony+sqlite://` or `symfony+mysql://` DSN.
//! - `RedisTransport` (feature `redis`): Symfony's Redis transport (a stream, a consumer group,
//!   delayed messages in `<stream>__queue`), read and written as PHP does, so that PHP and
//!   Courier workers share one stream and group; `SymfonyTransportFactory` builds it from a
//!   `symfony+redis://host:port/<stream>/<group>/<consumer>` DSN with Symfony's options.
//! - `AmqpTransport` (feature `amqp`): Symfony's AMQP transport on RabbitMQ, its exchange,
//!   queues, delay exchange and delay queues laid out and its messages published as PHP's
//!   `Bridge\Amqp` does (headers as an AMQP table, `content_type` property, persistent), so
//!   that PHP and Courier workers share its queues, delayed messages and retries included.
//!   `SymfonyTransportFactory` builds it from a `symfony+amqp://user:pass@host:5672/vhost/exchange`
//!   DSN with PHP's options (`queues[name][binding_keys][]=...`, `delay[exchange_name]=...`).
//!
//! The PHP side must use `messenger.transport.symfony_serializer` on the transports it shares
//! with Courier.
//!
//! ```
//! use courier_core::{Envelope, Message, MessageRegistry};
//! use courier_symfony::{SymfonySerializer, SymfonyTypes};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Ping { n: u32 }
//! impl Message for Ping { const NAME: &'static str = "app.ping"; }
//!
//! let registry = MessageRegistry::new().with::<Ping>();
//! let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\Ping", "app.ping"));
//! let wire = serializer.encode(&registry, &Envelope::new(Ping { n: 1 }))?;
//! let headers = wire.headers_json();
//! let back = serializer.decode(&registry, wire.body, &headers);
//! assert_eq!(back.message::<Ping>().map(|p| p.n), Some(1));
//! # Ok::<(), courier_core::EncodeError>(())
//! ```

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod doctrine;
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis",
    feature = "amqp"
))]
mod factory;
pub mod php_datetime;
mod php_envelope;
mod php_json;
mod php_serialize;
#[cfg(feature = "redis")]
mod redis;
pub mod redis_field;
mod serializer;
mod stamps;
mod types;

#[cfg(feature = "amqp")]
pub use amqp::{AmqpOptions, AmqpQueue, AmqpTransport, QueueArgument, amqp_uri};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use doctrine::{DoctrineOptions, DoctrineTransport};
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "mysql",
    feature = "redis",
    feature = "amqp"
))]
pub use factory::SymfonyTransportFactory;
pub use php_serialize::PhpSerializeError;
#[cfg(feature = "redis")]
pub use redis::{RedisOptions, RedisTransport};
pub use serializer::{PHP_DECODE_ERROR_HEADER, SymfonyEncoded, SymfonySerializer};
pub use stamps::SYMFONY_STAMP_PREFIX;
pub use types::SymfonyTypes;
