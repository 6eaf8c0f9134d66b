//! The AMQP form of Courier's wire format: the JSON body as the message body, `content-type` as
//! the `content_type` property, every other header as an AMQP long-string header, and the
//! transport message id as the `message_id` property.

use std::collections::BTreeMap;

use courier_core::{CONTENT_TYPE_HEADER, Encoded};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::delay::DELAY_HEADER;

/// Headers the broker adds when dead-lettering, and Courier's routing header: dropped on receive
/// so they do not travel on with a retried message.
fn is_broker_header(name: &str) -> bool {
    name == DELAY_HEADER
        || name == "x-death"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// What goes on the wire for one publish.
pub(crate) struct Outgoing {
    pub(crate) body: Vec<u8>,
    pub(crate) properties: BasicProperties,
}

/// Builds body and properties; `extra` adds routing headers (the delay bucket).
pub(crate) fn outgoing(
    encoded: Encoded,
    message_id: &str,
    persistent: bool,
    priority: Option<u8>,
    extra: Option<(&str, String)>,
) -> Outgoing {
    let Encoded { body, headers } = encoded;
    let mut table = FieldTable::default();
    // Absent stays absent: an undecodable message read without one goes on without one.
    let mut content_type = None;
    for (name, value) in headers {
        if name == CONTENT_TYPE_HEADER {
            content_type = Some(value);
        } else {
            table.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value)),
            );
        }
    }
    if let Some((name, value)) = extra {
        table.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    let mut properties = BasicProperties::default()
        .with_message_id(ShortString::from(message_id))
        .with_headers(table);
    if let Some(content_type) = content_type {
        properties = properties.with_content_type(ShortString::from(content_type));
    }
    if persistent {
        properties = properties.with_delivery_mode(2);
    }
    if let Some(p) = priority {
        properties = properties.with_priority(p);
    }
    Outgoing {
        body: body.into_bytes(),
        properties,
    }
}

/// Reads a delivery's headers back into wire form: string headers (numbers and booleans written
/// as text, tables and arrays skipped), the `content_type` property as `content-type`. The body
/// stays bytes: one that is not UTF-8 decodes to an undecodable envelope that keeps them
/// ([`MessageRegistry::decode_bytes`](courier_core::MessageRegistry::decode_bytes)).
pub(crate) fn incoming(properties: &BasicProperties) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str();
            if is_broker_header(name) {
                continue;
            }
            if let Some(text) = text_of(value) {
                headers.insert(name.to_owned(), text);
            }
        }
    }
    if let Some(ct) = properties.content_type() {
        headers.insert(CONTENT_TYPE_HEADER.to_owned(), ct.as_str().to_owned());
    }
    headers
}

fn text_of(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(i) => i.to_string(),
        AMQPValue::ShortShortUInt(i) => i.to_string(),
        AMQPValue::ShortInt(i) => i.to_string(),
        AMQPValue::ShortUInt(i) => i.to_string(),
        AMQPValue::LongInt(i) => i.to_string(),
        AMQPValue::LongUInt(i) => i.to_string(),
        AMQPValue::LongLongInt(i) => i.to_string(),
        AMQPValue::Timestamp(t) => t.to_string(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_travel_as_strings_and_content_type_as_the_property() {
        let encoded = Encoded::new("{\"a\":\"ü\"}")
            .header("type", "t.x")
            .header("content-type", "application/json")
            .header("x-courier-stamp-delay", "[5]");
        let out = outgoing(
            encoded.clone(),
            "id-1",
            true,
            Some(3),
            Some((DELAY_HEADER, "exchange:10".into())),
        );
        assert_eq!(
            out.properties
                .message_id()
                .as_ref()
                .map(ShortString::as_str),
            Some("id-1")
        );
        assert_eq!(*out.properties.delivery_mode(), Some(2));
        assert_eq!(*out.properties.priority(), Some(3));
        let back = Encoded {
            body: String::from_utf8(out.body).unwrap_or_default(),
            headers: incoming(&out.properties),
        };
        assert_eq!(back, encoded);
    }

    #[test]
    fn a_message_without_content_type_goes_without_one() {
        let out = outgoing(Encoded::new("x"), "id-1", false, None, None);
        assert_eq!(out.properties.content_type(), &None);
        assert!(!incoming(&out.properties).contains_key(CONTENT_TYPE_HEADER));
    }
}
