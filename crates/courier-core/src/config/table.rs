//! [`Table`]: a table of the configuration kept as written for the crate that reads it, and
//! [`TransportOptions`], a transport's `options`; neither shows the TOML types beneath.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// A table of the configuration kept as written, for the crate that reads it: `[runs]`
/// ([`Config::runs`](super::Config::runs)), `[agents.NAME]`, a schedule's `payload` or `input`.
///
/// ```
/// use courier_core::config::Table;
///
/// #[derive(serde::Deserialize)]
/// struct Lease { lease: String }
///
/// let table: Table = "lease = \"30s\"".parse()?;
/// assert_eq!(table.deserialize::<Lease>()?.lease, "30s");
/// assert_eq!(table.to_json()["lease"], "30s");
/// # Ok::<(), courier_core::config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Table(toml::Table);

impl Table {
    /// Reads the table as `T`.
    ///
    /// # Errors
    /// [`ConfigError`] saying which key does not fit `T`, and how.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        self.0
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::new(e.message().trim_end().to_owned()))
    }

    /// The table as a JSON object.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.0).unwrap_or_default()
    }

    /// The value of `key`, as JSON.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<serde_json::Value> {
        self.0.get(key).and_then(|v| serde_json::to_value(v).ok())
    }

    /// Whether the table has no key.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::str::FromStr for Table {
    type Err = ConfigError;

    /// Parses TOML text.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse::<toml::Table>()
            .map(Self)
            .map_err(|e| ConfigError::new(e.message().trim_end().to_owned()))
    }
}

/// A transport's `options`: name -> value, merged into its DSN's query.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct TransportOptions(BTreeMap<String, toml::Value>);

impl TransportOptions {
    /// Each option with its value as DSN text (`None`: not a string, number or boolean).
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<String>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), option_text(v)))
    }

    /// Whether there is no option.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn option_text(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}
