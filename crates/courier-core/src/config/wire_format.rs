//! A transport's `serializer`: Courier's own wire format, or Symfony Messenger's on Symfony's
//! own layouts.

use serde::Deserialize;

use super::{ConfigError, TransportConfig};
use crate::Dsn;

/// A transport's `serializer`: how its messages are written, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum WireFormat {
    /// `"courier"`: Courier's own format and layout (the default).
    Courier,
    /// `"symfony"`: Symfony Messenger's JSON `Serializer` format, on Symfony's own layout
    /// of the DSN's server (the Doctrine table `messenger_messages`, the Redis stream, the AMQP
    /// exchange and queue), so that PHP workers read and write the same messages. The same as
    /// the DSN's scheme prefixed with `symfony+` (the `courier-symfony` crate, feature
    /// `symfony`).
    Symfony,
}

/// The schemes Symfony Messenger has a layout for (`serializer = "symfony"`).
const SYMFONY_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "sqlite",
    "mysql",
    "mariadb",
    "redis",
    "amqp",
];

/// The prefix of the schemes of Symfony's layouts.
const SYMFONY_PREFIX: &str = "symfony+";

impl TransportConfig {
    /// Checks that `serializer` fits the DSN's scheme.
    pub(super) fn check_serializer(&self, name: &str) -> Result<(), ConfigError> {
        let scheme = self.dsn.scheme();
        match self.serializer {
            Some(WireFormat::Symfony)
                if !scheme.starts_with(SYMFONY_PREFIX) && !SYMFONY_SCHEMES.contains(&scheme) =>
            {
                Err(ConfigError::new(format!(
                    "transports.{name}.serializer: \"symfony\" needs a server Symfony Messenger \
                     has a layout for ({}), not `{scheme}`",
                    SYMFONY_SCHEMES.join(", ")
                )))
            }
            Some(WireFormat::Courier) if scheme.starts_with(SYMFONY_PREFIX) => {
                Err(ConfigError::new(format!(
                    "transports.{name}.serializer: \"courier\" contradicts the scheme `{scheme}`, \
                     which is Symfony's format: drop the `symfony+` prefix or the serializer"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The DSN as written, under Symfony's scheme when `serializer = "symfony"`.
    pub(super) fn dsn_of_format(&self) -> Dsn {
        match self.serializer {
            Some(WireFormat::Symfony) if !self.dsn.scheme().starts_with(SYMFONY_PREFIX) => {
                self.dsn.with_scheme_prefix(SYMFONY_PREFIX)
            }
            _ => self.dsn.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        text.parse::<Config>().map_err(|e| e.to_string())
    }

    #[test]
    fn symfony_puts_the_dsn_under_symfonys_scheme_with_its_options() {
        let c = parse(
            "[transports.a]\ndsn = \"redis://:hunter2@h/messages/symfony/rust\"\nserializer = \"symfony\"\n\
             options = { serializer = 0 }\n\
             [transports.b]\ndsn = \"sqlite://x.db\"\n\
             [transports.c]\ndsn = \"symfony+amqp://h/%2f/e\"\nserializer = \"symfony\"\n\
             [transports.d]\ndsn = \"postgres://db/app?queue_name=q\"\nserializer = \"courier\"\n",
        )
        .expect("config");
        let a = c.effective_dsn("a").expect("a");
        assert_eq!(a.scheme(), "symfony+redis");
        assert_eq!(a.path(), "/messages/symfony/rust");
        assert_eq!(a.option("serializer"), Some("0"), "options still merged");
        assert!(!a.to_string().contains("hunter2"), "{a}");
        assert_eq!(
            c.effective_dsn("b").expect("b").scheme(),
            "sqlite",
            "Courier's by default"
        );
        assert_eq!(
            c.effective_dsn("c").expect("c").scheme(),
            "symfony+amqp",
            "not prefixed twice"
        );
        assert_eq!(c.effective_dsn("d").expect("d").scheme(), "postgres");
    }

    #[test]
    fn a_serializer_that_does_not_fit_the_scheme_is_refused_naming_it() {
        let err = parse("[transports.a]\ndsn = \"nats://h/s\"\nserializer = \"symfony\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("transports.a.serializer") && err.contains("not `nats`"),
            "{err}"
        );
        let err = parse("[transports.a]\ndsn = \"symfony+redis://h/s\"\nserializer = \"courier\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("transports.a.serializer") && err.contains("contradicts"),
            "{err}"
        );
        let err = parse("[transports.a]\ndsn = \"redis://h/s\"\nserializer = \"php\"")
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("unknown variant `php`") && err.contains("symfony"),
            "{err}"
        );
    }
}
