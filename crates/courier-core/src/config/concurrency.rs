//! `[limits.concurrency.NAME]`: a concurrency key per message type, found in the message's
//! JSON body, and the most messages of one key handled at once on the transports the type is
//! routed to.
//!
//! ```toml
//! [limits.concurrency."app.webhook"]   # a wire name or `prefix.*`, as in [routing]
//! key = "$.tenant_id"
//! max = 5
//! ```
//!
//! At load, the key path, `max` (at least 1) and the routing are checked, each naming its key;
//! every transport the type is routed to gets `concurrency_max = max` (a transport that cannot
//! limit per key refuses it when it connects, naming itself). At dispatch, [`ConcurrencyKeys`]
//! stamps each message of the type with a
//! [`ConcurrencyKeyStamp`](crate::ConcurrencyKeyStamp) read from its body; a message whose
//! field is missing, not a string, or longer than 200 bytes is refused, naming the message and
//! the path, before anything is stored.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::Deserialize;

use super::ConfigError;
use crate::{
    BusError, ConcurrencyKeyStamp, Envelope, KeyPath, Middleware, Next, ReceivedStamp, Router,
};

/// The `[limits]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LimitsConfig {
    /// `[limits.concurrency.NAME]` by message wire name or `prefix.*` pattern.
    #[serde(default)]
    pub concurrency: BTreeMap<String, ConcurrencyLimitConfig>,
}

/// One `[limits.concurrency.NAME]` table. Values are read as written and checked by
/// [`Config::validate`](super::Config::validate), so a bad one is an error naming its key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ConcurrencyLimitConfig {
    /// A JSON path to a string field of the body: `$.tenant_id`, `$.customer.id`.
    pub key: String,
    /// The most messages of one key handled at once, across every worker (at least 1).
    pub max: i64,
}

impl ConcurrencyLimitConfig {
    /// The key path of `limits.concurrency.NAME`.
    ///
    /// # Errors
    /// [`ConfigError`] naming `limits.concurrency.NAME.key`.
    pub fn key_path(&self, name: &str) -> Result<KeyPath, ConfigError> {
        KeyPath::parse(&self.key)
            .map_err(|e| ConfigError::new(format!("limits.concurrency.\"{name}\".key: {e}")))
    }

    /// The limit of `limits.concurrency.NAME`.
    ///
    /// # Errors
    /// [`ConfigError`] naming `limits.concurrency.NAME.max`.
    pub fn max(&self, name: &str) -> Result<u32, ConfigError> {
        u32::try_from(self.max)
            .ok()
            .filter(|m| *m > 0)
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "limits.concurrency.\"{name}\".max: expected at least 1, got {} \
                     (0 would never hand a message of the type to a handler)",
                    self.max
                ))
            })
    }
}

impl LimitsConfig {
    /// Checks every table against the routing, and returns the `concurrency_max` each routed
    /// transport gets, by transport name.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key at fault: a bad key path or `max`, a type routed to no
    /// transport, or two limits (or a limit and the transport's own `concurrency_max` option)
    /// asking one transport for different maxima.
    pub(super) fn transport_maxima(
        &self,
        router: &Router,
        own: impl Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, (u32, String)>, ConfigError> {
        let mut maxima: BTreeMap<String, (u32, String)> = BTreeMap::new();
        for (name, limit) in &self.concurrency {
            limit.key_path(name)?;
            let max = limit.max(name)?;
            let transports = router.resolve(name);
            if transports.is_empty() {
                return Err(ConfigError::new(format!(
                    "limits.concurrency.\"{name}\": no [routing] entry sends `{name}` to a \
                     transport (a concurrency limit holds on a transport's queue)"
                )));
            }
            for t in transports {
                if let Some(option) = own(t)
                    && option != max.to_string()
                {
                    return Err(ConfigError::new(format!(
                        "limits.concurrency.\"{name}\".max: {max}, but transport `{t}` sets \
                         concurrency_max={option} (a transport has one maximum per key)"
                    )));
                }
                if let Some((other, by)) = maxima.get(t)
                    && *other != max
                {
                    return Err(ConfigError::new(format!(
                        "limits.concurrency.\"{name}\".max: {max}, but limits.concurrency.\"{by}\" \
                         gives transport `{t}` {other} (a transport has one maximum per key)"
                    )));
                }
                maxima.insert(t.clone(), (max, name.clone()));
            }
        }
        Ok(maxima)
    }

    /// The bus step that stamps each message with its key, `None` without limits.
    ///
    /// # Errors
    /// [`ConfigError`] naming a bad key path.
    pub fn keys(&self) -> Result<Option<ConcurrencyKeys>, ConfigError> {
        if self.concurrency.is_empty() {
            return Ok(None);
        }
        let mut keys = ConcurrencyKeys::default();
        for (name, limit) in &self.concurrency {
            keys = keys.key(name, limit.key_path(name)?);
        }
        Ok(Some(keys))
    }
}

/// A bus step (a [`Middleware`]) that gives each outgoing message of the configured types a
/// [`ConcurrencyKeyStamp`] read from its JSON body, unless it carries one already. Received
/// messages pass through untouched.
///
/// ```
/// use courier_core::config::ConcurrencyKeys;
/// use courier_core::KeyPath;
///
/// let keys = ConcurrencyKeys::default().key("app.webhook", KeyPath::parse("$.tenant_id")?);
/// # let _ = keys;
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConcurrencyKeys {
    patterns: Router,
    paths: BTreeMap<String, KeyPath>,
}

impl ConcurrencyKeys {
    /// Keys the messages whose wire names match `pattern` (exact, `prefix.*` or `*`, as in
    /// routing) by `path`.
    #[must_use]
    pub fn key(mut self, pattern: &str, path: KeyPath) -> Self {
        self.patterns = self.patterns.route(pattern, [pattern]);
        self.paths.insert(pattern.to_owned(), path);
        self
    }

    /// Stamps `envelope` with its key when its type is keyed.
    ///
    /// # Errors
    /// [`ConcurrencyKeyError`] naming the message and why its key cannot be read.
    pub fn stamp(&self, envelope: Envelope) -> Result<Envelope, ConcurrencyKeyError> {
        if envelope.last::<ConcurrencyKeyStamp>().is_some()
            || envelope.last::<ReceivedStamp>().is_some()
        {
            return Ok(envelope);
        }
        let Some(path) = self
            .patterns
            .resolve(envelope.message_name())
            .first()
            .and_then(|p| self.paths.get(p))
        else {
            return Ok(envelope);
        };
        let refuse = |reason: String| ConcurrencyKeyError {
            message: envelope.message_name().to_owned(),
            reason,
        };
        let encoded = crate::encode_json(&envelope).map_err(|e| refuse(e.to_string()))?;
        let key = path.find(&encoded.body).map_err(refuse)?;
        Ok(envelope.with(key))
    }
}

#[async_trait]
impl Middleware for ConcurrencyKeys {
    async fn handle(&self, envelope: Envelope, next: Next<'_>) -> Result<Envelope, BusError> {
        let envelope = self
            .stamp(envelope)
            .map_err(|e| BusError::Middleware(Box::new(e)))?;
        next.run(envelope).await
    }
}

/// A message of a keyed type whose concurrency key cannot be read from its body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("message `{message}`: {reason}")]
pub struct ConcurrencyKeyError {
    /// The wire name.
    pub message: String,
    /// Why: the path and what it found.
    pub reason: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse_with(text, |_| None).map_err(|e| e.to_string())
    }

    const ROUTED: &str = "[transports.jobs]\ndsn = \"postgres://localhost/app\"\n\
        [transports.other]\ndsn = \"redis://localhost\"\n\
        [routing]\n\"app.*\" = \"jobs\"\n\"mail.send\" = \"other\"\n";

    #[test]
    fn a_limit_gives_its_transports_concurrency_max() {
        let c = parse(&format!(
            "{ROUTED}[limits.concurrency.\"app.webhook\"]\nkey = \"$.tenant_id\"\nmax = 5\n"
        ))
        .unwrap();
        let dsn = c.effective_dsn("jobs").unwrap();
        assert_eq!(dsn.option("concurrency_max"), Some("5"));
        assert_eq!(
            c.effective_dsn("other").unwrap().option("concurrency_max"),
            None
        );
        assert!(c.limits.keys().unwrap().is_some());
    }

    #[test]
    fn bad_limits_are_refused_at_load_naming_the_key() {
        for (table, expected) in [
            (
                "key = \"$.tenant_id\"\nmax = 0",
                "limits.concurrency.\"app.webhook\".max: expected at least 1, got 0",
            ),
            (
                "key = \"$.tenant_id\"\nmax = -2",
                "limits.concurrency.\"app.webhook\".max: expected at least 1, got -2",
            ),
            (
                "key = \"tenant_id\"\nmax = 5",
                "limits.concurrency.\"app.webhook\".key: concurrency_key `tenant_id`: expected a JSON path",
            ),
            (
                "key = \"$.t\"\nmax = 5\nweight = 2",
                "unknown field `weight`",
            ),
            ("max = 5", "missing field `key`"),
        ] {
            let err = parse(&format!(
                "{ROUTED}[limits.concurrency.\"app.webhook\"]\n{table}\n"
            ))
            .unwrap_err();
            assert!(err.contains(expected), "{table}: {err}");
        }
        let err = parse(&format!(
            "{ROUTED}[limits.concurrency.\"billing.charge\"]\nkey = \"$.t\"\nmax = 5\n"
        ))
        .unwrap_err();
        assert!(
            err.contains("no [routing] entry sends `billing.charge`"),
            "{err}"
        );
        let err = parse(&format!(
            "{ROUTED}[limits.concurrency.\"app.a\"]\nkey = \"$.t\"\nmax = 5\n\
             [limits.concurrency.\"app.b\"]\nkey = \"$.t\"\nmax = 3\n"
        ))
        .unwrap_err();
        assert!(err.contains("one maximum per key"), "{err}");
        let err = parse(
            "[transports.jobs]\ndsn = \"postgres://localhost/app?concurrency_max=2\"\n\
             [routing]\n\"app.*\" = \"jobs\"\n\
             [limits.concurrency.\"app.a\"]\nkey = \"$.t\"\nmax = 5\n",
        )
        .unwrap_err();
        assert!(err.contains("sets concurrency_max=2"), "{err}");
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Hook {
        tenant_id: serde_json::Value,
    }
    impl crate::Message for Hook {
        const NAME: &'static str = "app.webhook";
    }

    fn keys() -> ConcurrencyKeys {
        ConcurrencyKeys::default().key("app.*", KeyPath::parse("$.tenant_id").unwrap())
    }

    fn key_of(e: &Envelope) -> Option<&str> {
        e.last::<ConcurrencyKeyStamp>()
            .map(ConcurrencyKeyStamp::as_str)
    }

    #[test]
    fn a_message_is_stamped_with_the_key_its_body_holds() {
        let e = keys()
            .stamp(Envelope::new(Hook {
                tenant_id: "acme".into(),
            }))
            .unwrap();
        assert_eq!(key_of(&e), Some("acme"));
        let own = Envelope::new(Hook {
            tenant_id: "acme".into(),
        })
        .with(ConcurrencyKeyStamp::new("mine").unwrap());
        assert_eq!(
            key_of(&keys().stamp(own).unwrap()),
            Some("mine"),
            "a stamp wins"
        );
        let other = ConcurrencyKeys::default().key("mail.*", KeyPath::parse("$.x").unwrap());
        let e = other
            .stamp(Envelope::new(Hook {
                tenant_id: 1.into(),
            }))
            .unwrap();
        assert_eq!(key_of(&e), None, "another type is not keyed");
    }

    #[test]
    fn a_message_without_a_valid_key_is_refused_naming_it() {
        for (tenant, expected) in [
            (serde_json::Value::Null, "expected a string, found null"),
            (7.into(), "expected a string, found a number"),
            ("x".repeat(201).into(), "201 bytes, expected at most 200"),
        ] {
            let err = keys()
                .stamp(Envelope::new(Hook { tenant_id: tenant }))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("message `app.webhook`: concurrency_key `$.tenant_id`: ")
                    && err.contains(expected),
                "{err}"
            );
        }
        let missing = ConcurrencyKeys::default().key("app.*", KeyPath::parse("$.account").unwrap());
        let err = missing
            .stamp(Envelope::new(Hook {
                tenant_id: "a".into(),
            }))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`$.account`: missing from the message"),
            "{err}"
        );
    }
}
