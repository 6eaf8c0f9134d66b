//! `[buses.NAME]` tables and `default_bus`: several named buses declared in the configuration
//! (Messenger's `framework.messenger.buses`), each with its middleware (names the application
//! registered) and whether a message without a handler is an error.
//!
//! ```toml
//! default_bus = "command"
//!
//! [buses.command]
//! middleware = ["audit"]          # in list order, after the built-in steps
//!
//! [buses.event]
//! allow_no_handlers = true        # an event nobody listens to is not an error
//! ```
//!
//! Without a `[buses]` table there is one bus, [`DEFAULT_BUS`](crate::DEFAULT_BUS).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ConfigError;

/// One `[buses.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BusConfig {
    /// Middleware by the names the application registered them under, in order.
    pub middleware: Vec<String>,
    /// A message with no applicable handler is handled by doing nothing (default false: it
    /// fails with `no handler`).
    pub allow_no_handlers: bool,
}

/// The default bus's name: `default_bus`, else the only bus declared, else
/// [`DEFAULT_BUS`](crate::DEFAULT_BUS).
pub(super) fn default_bus<'a>(
    default_bus: Option<&'a str>,
    buses: &'a BTreeMap<String, BusConfig>,
) -> &'a str {
    match (default_bus, buses.len()) {
        (Some(name), _) => name,
        (None, 1) => buses
            .keys()
            .next()
            .map_or(crate::DEFAULT_BUS, String::as_str),
        (None, _) => crate::DEFAULT_BUS,
    }
}

/// Checks `default_bus` and the bus names.
pub(super) fn validate(
    default_bus: Option<&str>,
    buses: &BTreeMap<String, BusConfig>,
) -> Result<(), ConfigError> {
    for name in buses.keys() {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !valid {
            return Err(ConfigError::new(format!(
                "buses.{name}: a bus name is letters, digits, `_`, `-` and `.`"
            )));
        }
    }
    match default_bus {
        Some(name) if !buses.is_empty() && !buses.contains_key(name) => {
            Err(ConfigError::new(format!(
                "default_bus: unknown bus `{name}` (declared: {})",
                buses.keys().cloned().collect::<Vec<_>>().join(", ")
            )))
        }
        None if buses.len() > 1 && !buses.contains_key(crate::DEFAULT_BUS) => {
            Err(ConfigError::new(format!(
                "default_bus: several buses are declared ({}); say which one is the default",
                buses.keys().cloned().collect::<Vec<_>>().join(", ")
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse_with(text, |_| None).map_err(|e| e.to_string())
    }

    #[test]
    fn buses_are_declared_with_middleware_and_allow_no_handlers() {
        let c = parse(
            "default_bus = \"command\"\n[buses.command]\nmiddleware = [\"audit\", \"tx\"]\n\
             [buses.event]\nallow_no_handlers = true",
        )
        .expect("parses");
        assert_eq!(c.default_bus_name(), "command");
        assert_eq!(c.buses["command"].middleware, ["audit", "tx"]);
        assert!(!c.buses["command"].allow_no_handlers);
        assert!(c.buses["event"].allow_no_handlers);
    }

    #[test]
    fn the_default_bus_is_the_only_one_declared_or_default() {
        assert_eq!(parse("").expect("parses").default_bus_name(), "default");
        let c = parse("[buses.command]").expect("parses");
        assert_eq!(c.default_bus_name(), "command");
        let c = parse("[buses.default]\n[buses.event]").expect("parses");
        assert_eq!(c.default_bus_name(), "default");
    }

    #[test]
    fn an_ambiguous_or_unknown_default_bus_is_named() {
        let err = parse("[buses.command]\n[buses.event]").expect_err("ambiguous");
        assert!(
            err.contains("default_bus") && err.contains("command, event"),
            "{err}"
        );
        let err = parse("default_bus = \"query\"\n[buses.command]").expect_err("unknown");
        assert!(err.contains("default_bus: unknown bus `query`"), "{err}");
        let err = parse("[buses.command]\nmiddlewares = []").expect_err("unknown key");
        assert!(err.contains("unknown field `middlewares`"), "{err}");
        let err = parse("[buses.\"a b\"]").expect_err("bad name");
        assert!(err.contains("buses.a b"), "{err}");
    }
}
