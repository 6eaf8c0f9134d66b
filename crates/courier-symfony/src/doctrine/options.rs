//! [`DoctrineOptions`]: the options of Symfony's Doctrine transport that Courier honours.

use std::time::Duration;

use chrono_tz::Tz;

/// The options of Symfony's Doctrine transport, with its defaults: table `messenger_messages`,
/// queue `default`, a redelivery horizon of an hour, datetimes in UTC.
///
/// Set them as PHP's `messenger.yaml` does on the transport both sides share, and the zone to
/// PHP's `date.timezone`: the table's datetimes are wall-clock values in that zone.
///
/// ```
/// use std::time::Duration;
/// use courier_symfony::DoctrineOptions;
///
/// let options = DoctrineOptions::default()
///     .table_name("messenger_messages")
///     .queue_name("emails")
///     .redeliver_timeout(Duration::from_secs(600))
///     .zone(chrono_tz::Europe::Paris);
/// assert_eq!(options.queue(), "emails");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctrineOptions {
    pub(crate) table_name: String,
    pub(crate) queue_name: String,
    pub(crate) redeliver_timeout: Duration,
    pub(crate) zone: Tz,
    pub(crate) auto_setup: bool,
}

impl Default for DoctrineOptions {
    fn default() -> Self {
        Self {
            table_name: "messenger_messages".to_owned(),
            queue_name: "default".to_owned(),
            redeliver_timeout: Duration::from_secs(3600),
            zone: Tz::UTC,
            auto_setup: true,
        }
    }
}

impl DoctrineOptions {
    /// The table (`table_name`, default `messenger_messages`): letters, digits and `_` only.
    #[must_use]
    pub fn table_name(mut self, table: impl Into<String>) -> Self {
        self.table_name = table.into();
        self
    }

    /// The queue (`queue_name`, default `default`).
    #[must_use]
    pub fn queue_name(mut self, queue: impl Into<String>) -> Self {
        self.queue_name = queue.into();
        self
    }

    /// How long after its `delivered_at` a message nobody acked is delivered again
    /// (`redeliver_timeout`, default an hour, whole seconds). Use PHP's value: Courier keeps
    /// what it holds alive well within it.
    #[must_use]
    pub fn redeliver_timeout(mut self, timeout: Duration) -> Self {
        self.redeliver_timeout = timeout;
        self
    }

    /// PHP's time zone (`date.timezone`), in which the table's datetimes are written.
    #[must_use]
    pub fn zone(mut self, zone: Tz) -> Self {
        self.zone = zone;
        self
    }

    /// Whether [`connect`](crate::DoctrineTransport::connect) creates the table when missing
    /// (`auto_setup`, default on).
    #[must_use]
    pub fn auto_setup(mut self, on: bool) -> Self {
        self.auto_setup = on;
        self
    }

    /// The table.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table_name
    }

    /// The queue.
    #[must_use]
    pub fn queue(&self) -> &str {
        &self.queue_name
    }

    /// Whether the table name is a plain identifier (it is written into SQL).
    pub(crate) fn valid_table(&self) -> bool {
        !self.table_name.is_empty()
            && self.table_name.len() <= 63
            && self
                .table_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !self.table_name.as_bytes()[0].is_ascii_digit()
    }
}
