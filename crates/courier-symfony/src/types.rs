//! [`SymfonyTypes`]: PHP classes to Courier wire names and back (`[symfony.types]`).

use std::collections::{BTreeMap, HashMap};

use courier_core::config::{Config, ConfigError};

/// Which Courier message a PHP message class is, and back: the `[symfony.types]` table.
///
/// A PHP class with no entry keeps its class name as Courier's `type`, so a message of it does
/// not decode ([`DecodeError::UnknownType`](courier_core::DecodeError::UnknownType) names the
/// class) and lands in the failure transport, body and headers kept.
///
/// ```
/// use courier_symfony::SymfonyTypes;
///
/// let types = SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send");
/// assert_eq!(types.wire_name(r"App\Message\SendEmail"), Some("mail.send"));
/// assert_eq!(types.php_class("mail.send"), Some(r"App\Message\SendEmail"));
/// assert_eq!(types.wire_name(r"App\Message\Other"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SymfonyTypes {
    to_wire: HashMap<String, String>,
    to_php: HashMap<String, String>,
}

impl SymfonyTypes {
    /// No mapping.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps the PHP class `php_class` (`App\Message\SendEmail`) to the Courier wire name
    /// `wire_name` (`mail.send`), both ways. A later mapping of either side replaces the
    /// earlier one.
    #[must_use]
    pub fn map(mut self, php_class: impl Into<String>, wire_name: impl Into<String>) -> Self {
        let (php_class, wire_name) = (php_class.into(), wire_name.into());
        if let Some(old) = self.to_wire.insert(php_class.clone(), wire_name.clone()) {
            self.to_php.remove(&old);
        }
        if let Some(old) = self.to_php.insert(wire_name, php_class) {
            self.to_wire.remove(&old);
        }
        self
    }

    /// The Courier wire name of a PHP class, if mapped.
    #[must_use]
    pub fn wire_name(&self, php_class: &str) -> Option<&str> {
        self.to_wire.get(php_class).map(String::as_str)
    }

    /// The PHP class of a Courier wire name, if mapped.
    #[must_use]
    pub fn php_class(&self, wire_name: &str) -> Option<&str> {
        self.to_php.get(wire_name).map(String::as_str)
    }

    /// The `[symfony.types]` table of a Courier configuration (`"App\\Message\\SendEmail" =
    /// "mail.send"`); none when the configuration has no `[symfony]` table.
    ///
    /// ```
    /// use courier_core::config::Config;
    /// use courier_symfony::SymfonyTypes;
    ///
    /// let config: Config = "[symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n".parse()?;
    /// let types = SymfonyTypes::from_config(&config)?;
    /// assert_eq!(types.wire_name(r"App\Message\SendEmail"), Some("mail.send"));
    /// # Ok::<(), courier_core::config::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`] naming a key of `[symfony]` other than `types`, or a value that is not
    /// a string.
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct SymfonyTable {
            #[serde(default)]
            types: BTreeMap<String, String>,
        }
        let Some(table) = &config.symfony else {
            return Ok(Self::new());
        };
        let table: SymfonyTable = table
            .deserialize()
            .map_err(|e| ConfigError::new(format!("[symfony]: {e}")))?;
        Ok(table.types.into_iter().collect())
    }

    /// How many classes are mapped.
    #[must_use]
    pub fn len(&self) -> usize {
        self.to_wire.len()
    }

    /// Whether no class is mapped.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.to_wire.is_empty()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for SymfonyTypes {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Self::new(), |types, (php, wire)| types.map(php, wire))
    }
}
