//! Serde for a `DateTime` field as Symfony's `DateTimeNormalizer` writes it: RFC 3339 with the
//! offset as `+00:00` (never `Z`) and whole seconds, `Y-m-d\TH:i:sP`.
//!
//! ```
//! use chrono::{DateTime, FixedOffset};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! #[serde(rename_all = "camelCase")]
//! struct Sent {
//!     #[serde(with = "courier_symfony::php_datetime")]
//!     at: DateTime<FixedOffset>,
//!     #[serde(with = "courier_symfony::php_datetime::option")]
//!     read_at: Option<DateTime<FixedOffset>>,
//! }
//!
//! let sent: Sent = serde_json::from_str(r#"{"at":"2024-05-06T07:08:09+00:00","readAt":null}"#)?;
//! assert_eq!(serde_json::to_string(&sent)?, r#"{"at":"2024-05-06T07:08:09+00:00","readAt":null}"#);
//! # Ok::<(), serde_json::Error>(())
//! ```

use chrono::{DateTime, FixedOffset, SecondsFormat};
use serde::{Deserialize, Deserializer, Serializer};

/// Writes the datetime as PHP does.
///
/// # Errors
/// Those of the serializer.
pub fn serialize<S: Serializer>(at: &DateTime<FixedOffset>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(SecondsFormat::Secs, false))
}

/// Reads an RFC 3339 datetime, keeping its offset.
///
/// # Errors
/// When the text is not RFC 3339.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<FixedOffset>, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    DateTime::parse_from_rfc3339(&text).map_err(serde::de::Error::custom)
}

/// The same for an `Option<DateTime<FixedOffset>>` (`null` when `None`).
pub mod option {
    use super::{DateTime, Deserialize, Deserializer, FixedOffset, Serializer};

    /// Writes the datetime as PHP does, or `null`.
    ///
    /// # Errors
    /// Those of the serializer.
    pub fn serialize<S: Serializer>(
        at: &Option<DateTime<FixedOffset>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => super::serialize(at, s),
            None => s.serialize_none(),
        }
    }

    /// Reads an RFC 3339 datetime or `null`.
    ///
    /// # Errors
    /// When the text is not RFC 3339.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<DateTime<FixedOffset>>, D::Error> {
        let text = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        text.map(|t| DateTime::parse_from_rfc3339(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}
