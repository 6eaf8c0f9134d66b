//! The transports a chaos scenario runs on.

use std::str::FromStr;

use crate::server::Kind;

/// The transports a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A SQLite file (no server: workers are killed while they write).
    Sqlite,
    /// A private PostgreSQL cluster.
    Postgres,
    /// A private MariaDB server.
    Mariadb,
    /// A private Redis server with an append-only file.
    Redis,
    /// A second RabbitMQ node.
    Rabbitmq,
    /// A private nats-server with JetStream (its own store directory).
    Nats,
}

impl Target {
    /// Every transport, in the order the suite runs them.
    pub const ALL: [Self; 6] = [
        Self::Sqlite,
        Self::Postgres,
        Self::Mariadb,
        Self::Redis,
        Self::Rabbitmq,
        Self::Nats,
    ];

    /// The name used on the command line and in the report.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::Mariadb => "mariadb",
            Self::Redis => "redis",
            Self::Rabbitmq => "rabbitmq",
            Self::Nats => "nats",
        }
    }

    /// The server the scenario starts, if any.
    #[must_use]
    pub fn server(self) -> Option<Kind> {
        match self {
            Self::Sqlite => None,
            Self::Postgres => Some(Kind::Postgres),
            Self::Mariadb => Some(Kind::Mariadb),
            Self::Redis => Some(Kind::Redis),
            Self::Rabbitmq => Some(Kind::Rabbitmq),
            Self::Nats => Some(Kind::Nats),
        }
    }
}

impl FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown transport `{s}` (sqlite, postgres, mariadb, redis, rabbitmq, nats)"
                )
            })
    }
}
