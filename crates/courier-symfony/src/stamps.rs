//! The stamps both Symfony and Courier know: each Symfony stamp header (a JSON list of the stamp
//! as Symfony's serializer normalizes it) to Courier's stamp header and back.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use serde_json::Value;

use crate::php_json::php_string;

/// The prefix of Symfony's stamp headers.
pub const SYMFONY_STAMP_PREFIX: &str = "X-Message-Stamp-";

/// One mapped stamp kind: its PHP class and Courier name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapped {
    BusName,
    Delay,
    Redelivery,
    ErrorDetails,
    SentToFailureTransport,
    TransportMessageId,
}

impl Mapped {
    /// In the order Courier writes them.
    pub(crate) const ALL: [Mapped; 6] = [
        Mapped::BusName,
        Mapped::Delay,
        Mapped::Redelivery,
        Mapped::ErrorDetails,
        Mapped::SentToFailureTransport,
        Mapped::TransportMessageId,
    ];

    pub(crate) fn php_class(self) -> &'static str {
        match self {
            Mapped::BusName => r"Symfony\Component\Messenger\Stamp\BusNameStamp",
            Mapped::Delay => r"Symfony\Component\Messenger\Stamp\DelayStamp",
            Mapped::Redelivery => r"Symfony\Component\Messenger\Stamp\RedeliveryStamp",
            Mapped::ErrorDetails => r"Symfony\Component\Messenger\Stamp\ErrorDetailsStamp",
            Mapped::SentToFailureTransport => {
                r"Symfony\Component\Messenger\Stamp\SentToFailureTransportStamp"
            }
            Mapped::TransportMessageId => {
                r"Symfony\Component\Messenger\Stamp\TransportMessageIdStamp"
            }
        }
    }

    /// The Courier stamp name, or `None` for a stamp Courier keeps verbatim (its transport id is
    /// local to Courier and set by the transport that received the message).
    pub(crate) fn courier_name(self) -> Option<&'static str> {
        match self {
            Mapped::BusName => Some("bus-name"),
            Mapped::Delay => Some("delay"),
            Mapped::Redelivery => Some("redelivery"),
            Mapped::ErrorDetails => Some("error-details"),
            Mapped::SentToFailureTransport => Some("sent-to-failure-transport"),
            Mapped::TransportMessageId => None,
        }
    }

    pub(crate) fn by_php_class(class: &str) -> Option<Mapped> {
        Self::ALL.into_iter().find(|m| m.php_class() == class)
    }

    /// Symfony's JSON list to Courier's, or `None` when an element does not have the shape
    /// Symfony writes (the header is then kept verbatim).
    pub(crate) fn to_courier(self, symfony_list: &str) -> Option<String> {
        let Value::Array(items) = serde_json::from_str::<Value>(symfony_list).ok()? else {
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for item in &items {
            out.push(match self {
                Mapped::BusName => Value::from(item.get("busName")?.as_str()?),
                Mapped::Delay => Value::from(item.get("delay")?.as_i64()?.max(0)),
                Mapped::Redelivery => serde_json::json!({
                    "retry_count": item.get("retryCount")?.as_u64()?,
                    "at": item.get("redeliveredAt").and_then(Value::as_str).and_then(epoch_ms).unwrap_or(0),
                }),
                Mapped::ErrorDetails => serde_json::json!({
                    "class": item.get("exceptionClass")?.as_str()?,
                    "message": item.get("exceptionMessage").and_then(Value::as_str).unwrap_or_default(),
                    "chain": [],
                }),
                Mapped::SentToFailureTransport => serde_json::json!({
                    "original": item.get("originalReceiverName")?.as_str()?,
                }),
                Mapped::TransportMessageId => return None,
            });
        }
        serde_json::to_string(&out).ok()
    }

    /// Courier's JSON list to Symfony's, as Symfony's serializer writes it (PHP's escapes,
    /// datetimes in `zone`), or `None` when an element is not Courier's shape.
    pub(crate) fn to_symfony(self, courier_list: &str, zone: Tz) -> Option<String> {
        let Value::Array(items) = serde_json::from_str::<Value>(courier_list).ok()? else {
            return None;
        };
        let mut out = String::from("[");
        for item in &items {
            if out.len() > 1 {
                out.push(',');
            }
            match self {
                Mapped::BusName => {
                    out.push_str(&format!("{{\"busName\":{}}}", php_string(item.as_str()?)));
                }
                Mapped::Delay => out.push_str(&format!("{{\"delay\":{}}}", item.as_u64()?)),
                Mapped::Redelivery => out.push_str(&format!(
                    "{{\"retryCount\":{},\"exceptionMessage\":null,\"flattenException\":null,\"redeliveredAt\":{}}}",
                    item.get("retry_count")?.as_u64()?,
                    php_string(&php_datetime(item.get("at")?.as_i64()?, zone)?),
                )),
                Mapped::ErrorDetails => out.push_str(&format!(
                    "{{\"exceptionClass\":{},\"exceptionCode\":0,\"exceptionMessage\":{},\"flattenException\":null}}",
                    php_string(item.get("class")?.as_str()?),
                    php_string(item.get("message")?.as_str()?),
                )),
                Mapped::SentToFailureTransport => out.push_str(&format!(
                    "{{\"originalReceiverName\":{}}}",
                    php_string(item.get("original")?.as_str()?)
                )),
                Mapped::TransportMessageId => {
                    out.push_str(&format!("{{\"id\":{}}}", php_string(item.as_str()?)));
                }
            }
        }
        out.push(']');
        Some(out)
    }
}

/// Epoch milliseconds of a datetime as Symfony's `DateTimeNormalizer` writes it (RFC 3339).
pub(crate) fn epoch_ms(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// A datetime as Symfony's `DateTimeNormalizer` writes it: `Y-m-d\TH:i:sP`, in `zone`.
pub(crate) fn php_datetime(epoch_ms: i64, zone: Tz) -> Option<String> {
    let utc = Utc.timestamp_millis_opt(epoch_ms).single()?;
    Some(
        utc.with_timezone(&zone)
            .fixed_offset()
            .to_rfc3339_opts(SecondsFormat::Secs, false),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datetime_is_written_with_its_zone_offset() {
        assert_eq!(
            php_datetime(1_704_161_045_000, Tz::Europe__Paris).as_deref(),
            Some("2024-01-02T03:04:05+01:00")
        );
        assert_eq!(
            php_datetime(1_704_161_045_000, Tz::UTC).as_deref(),
            Some("2024-01-02T02:04:05+00:00")
        );
        assert_eq!(
            epoch_ms("2024-01-02T03:04:05+01:00"),
            Some(1_704_161_045_000)
        );
    }

    #[test]
    fn a_redelivery_stamp_goes_both_ways() {
        let symfony = r#"[{"retryCount":2,"exceptionMessage":null,"flattenException":null,"redeliveredAt":"2024-01-02T02:04:05+00:00"}]"#;
        let courier = Mapped::Redelivery
            .to_courier(symfony)
            .expect("symfony shape");
        assert_eq!(courier, r#"[{"at":1704161045000,"retry_count":2}]"#);
        assert_eq!(
            Mapped::Redelivery.to_symfony(&courier, Tz::UTC).as_deref(),
            Some(symfony)
        );
    }

    #[test]
    fn a_stamp_of_another_shape_is_not_mapped() {
        assert_eq!(Mapped::Delay.to_courier(r#"[{"later":5}]"#), None);
        assert_eq!(Mapped::Delay.to_courier("not json"), None);
    }
}
