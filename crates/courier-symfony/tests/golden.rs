//! Courier against the golden vectors captured from real Symfony Messenger 5.4
//! (`tests/symfony/golden.php` writes them): what Courier writes is byte for byte what PHP
//! writes, and what PHP writes decodes to the right Rust values and stamps.

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use chrono::{DateTime, FixedOffset};
use courier_core::{
    BusNameStamp, DelayStamp, Envelope, ErrorDetailsStamp, Message, MessageRegistry,
    RedeliveryStamp, SentToFailureTransportStamp,
};
use courier_symfony::{SymfonySerializer, SymfonyTypes, redis_field};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Address {
    street: String,
    city: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Priority {
    // A PhpSerializer body holds the case name, not the backed value.
    #[serde(alias = "Low")]
    Low,
    #[serde(alias = "High")]
    High,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendEmail {
    id: i64,
    to: String,
    subject: String,
    address: Option<Address>,
    #[serde(with = "courier_symfony::php_datetime::option")]
    sent_at: Option<DateTime<FixedOffset>>,
    priority: Priority,
    tags: Vec<String>,
}

impl Message for SendEmail {
    const NAME: &'static str = "mail.send";
}

fn golden(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/symfony/golden")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn setup() -> (MessageRegistry, SymfonySerializer) {
    let registry = MessageRegistry::new().with::<SendEmail>();
    let types = SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send");
    (registry, SymfonySerializer::new(types))
}

fn email() -> SendEmail {
    SendEmail {
        id: 7,
        to: "a@example.com".into(),
        subject: "Grüße/€ \"quoted\"".into(),
        address: Some(Address {
            street: "1 Main St".into(),
            city: "Köln".into(),
        }),
        sent_at: DateTime::parse_from_rfc3339("2024-05-06T07:08:09+00:00").ok(),
        priority: Priority::High,
        tags: vec!["x".into(), "y".into()],
    }
}

fn at(secs: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// 2024-05-06T07:08:09Z.
const AT: u64 = 1_714_979_289;

#[test]
fn a_nested_dto_with_a_datetime_and_a_backed_enum_is_written_as_php_writes_it() {
    let (registry, serializer) = setup();
    let wire = serializer
        .encode(&registry, &Envelope::new(email()))
        .expect("encodes");
    assert_eq!(wire.body, golden("send_email.body"));
    assert_eq!(wire.headers_json(), golden("send_email.headers"));
}

#[test]
fn a_datetime_in_another_zone_keeps_its_offset_both_ways() {
    let (registry, serializer) = setup();
    let envelope = serializer.decode(
        &registry,
        golden("send_email_paris.body"),
        &golden("send_email_paris.headers"),
    );
    let message = envelope.message::<SendEmail>().expect("decodes").clone();
    assert_eq!(
        message.sent_at.map(|t| t.to_rfc3339()),
        Some("2024-01-02T03:04:05+01:00".to_owned())
    );
    let wire = serializer
        .encode(&registry, &Envelope::new(message))
        .expect("encodes");
    assert_eq!(wire.body, golden("send_email_paris.body"));
}

#[test]
fn every_mapped_stamp_is_read_and_written_back_unchanged() {
    let (registry, serializer) = setup();
    let envelope = serializer.decode(
        &registry,
        golden("all_stamps.body"),
        &golden("all_stamps.headers"),
    );
    assert_eq!(envelope.message::<SendEmail>(), Some(&email()));
    assert_eq!(
        envelope.last::<BusNameStamp>().map(|s| s.0.as_str()),
        Some("messenger.bus.default")
    );
    assert_eq!(
        envelope.last::<DelayStamp>().map(|s| s.0),
        Some(Duration::from_secs(5))
    );
    let redeliveries: Vec<_> = envelope.all::<RedeliveryStamp>().copied().collect();
    assert_eq!(
        redeliveries,
        vec![
            RedeliveryStamp {
                retry_count: 1,
                at: at(AT)
            },
            RedeliveryStamp {
                retry_count: 2,
                at: at(AT + 1)
            },
        ]
    );
    let details = envelope.last::<ErrorDetailsStamp>().expect("error details");
    assert_eq!(
        (details.class.as_str(), details.message.as_str()),
        ("RuntimeException", "boom")
    );
    assert_eq!(
        envelope
            .last::<SentToFailureTransportStamp>()
            .map(|s| s.original.as_str()),
        Some("async")
    );

    let wire = serializer.encode(&registry, &envelope).expect("encodes");
    assert_eq!(wire.body, golden("all_stamps.body"));
    assert_eq!(wire.headers_json(), golden("all_stamps.headers"));
}

#[test]
fn stamps_written_by_courier_are_the_ones_php_writes() {
    let (registry, serializer) = setup();
    let envelope = Envelope::new(email())
        .with(BusNameStamp("messenger.bus.default".into()))
        .with(DelayStamp(Duration::from_secs(5)))
        .with(RedeliveryStamp {
            retry_count: 1,
            at: at(AT),
        })
        .with(RedeliveryStamp {
            retry_count: 2,
            at: at(AT + 1),
        })
        .with(ErrorDetailsStamp {
            class: "RuntimeException".into(),
            message: "boom".into(),
            chain: Vec::new(),
        })
        .with(SentToFailureTransportStamp {
            original: "async".into(),
            at: at(AT),
        });
    let wire = serializer.encode(&registry, &envelope).expect("encodes");
    // PHP's vector also has the TransportMessageIdStamp, which only a transport sets.
    let expected = golden("all_stamps.headers").replace(
        r#","X-Message-Stamp-Symfony\\Component\\Messenger\\Stamp\\TransportMessageIdStamp":"[{\"id\":\"42\"}]""#,
        "",
    );
    assert_eq!(wire.headers_json(), expected);
}

#[test]
fn an_unknown_stamp_travels_verbatim() {
    let (registry, serializer) = setup();
    let envelope = serializer.decode(
        &registry,
        golden("unknown_stamp.body"),
        &golden("unknown_stamp.headers"),
    );
    assert!(
        envelope.decode_error().is_none(),
        "{:?}",
        envelope.decode_error()
    );
    let wire = serializer.encode(&registry, &envelope).expect("encodes");
    assert_eq!(wire.headers_json(), golden("unknown_stamp.headers"));
}

#[test]
fn a_php_serializer_envelope_is_read_with_its_stamps() {
    let (registry, serializer) = setup();
    let envelope = serializer.decode(
        &registry,
        golden("php_serializer.body"),
        &golden("php_serializer.headers"),
    );
    assert_eq!(envelope.message::<SendEmail>(), Some(&email()));
    assert_eq!(
        envelope
            .last::<RedeliveryStamp>()
            .map(|s| (s.retry_count, s.at)),
        Some((2, at(AT)))
    );
    assert_eq!(
        envelope.last::<DelayStamp>().map(|s| s.0),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        envelope.last::<BusNameStamp>().map(|s| s.0.as_str()),
        Some("messenger.bus.default")
    );
}

#[test]
fn a_base64_php_serializer_envelope_is_read() {
    let (registry, serializer) = setup();
    let envelope = serializer.decode(
        &registry,
        golden("php_serializer_base64.body"),
        &golden("php_serializer_base64.headers"),
    );
    let message = envelope.message::<SendEmail>().expect("decodes");
    assert!(message.subject.starts_with("bytes "), "{}", message.subject);
    assert_eq!(message.address, email().address);
}

#[test]
fn a_doctrine_row_with_headers_equal_to_an_empty_array_names_its_unmapped_class() {
    let (registry, serializer) = setup();
    let row: serde_json::Value =
        serde_json::from_str(&golden("doctrine_headers_empty.row")).expect("json row");
    let (body, headers) = (row["body"].as_str(), row["headers"].as_str());
    assert_eq!(headers, Some("[]"));
    let envelope = serializer.decode(&registry, body.unwrap_or_default().to_owned(), "[]");
    let error = envelope.decode_error().map(ToString::to_string);
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains(r"App\Message\Unmapped")),
        "{error:?}"
    );
}

#[test]
fn redis_fields_with_and_without_the_php_serializer_are_read_and_written_as_phpredis_does() {
    let (registry, serializer) = setup();
    for (vector, php_serialized) in [
        ("redis_serializer_php.field", true),
        ("redis_serializer_none.field", false),
    ] {
        let field = golden(vector);
        let (body, headers) = redis_field::read(field.as_bytes()).expect(vector);
        let envelope = serializer.decode(&registry, body, &headers);
        assert_eq!(envelope.message::<SendEmail>(), Some(&email()), "{vector}");
        let wire = serializer.encode(&registry, &envelope).expect("encodes");
        assert_eq!(redis_field::write(&wire, php_serialized), field, "{vector}");
    }
}

#[test]
fn a_delayed_redis_message_is_queued_and_moved_as_php_does() {
    let (registry, serializer) = setup();
    let member = golden("redis_queue_member.member");
    let (_, uniqid) = member.rsplit_once(",\"uniqid\":\"").expect("PHP's uniqid");
    let uniqid = uniqid.trim_end_matches("\"}");
    let (body, headers) = redis_field::read(member.as_bytes()).expect("member");
    let envelope = serializer.decode(&registry, body, &headers);
    assert_eq!(envelope.message::<SendEmail>(), Some(&email()));
    assert_eq!(
        envelope.last::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_millis(1)))
    );
    let wire = serializer.encode(&registry, &envelope).expect("encodes");
    assert_eq!(redis_field::queue_member(&wire, uniqid), member);
    // When due, PHP moves it to the stream as the entry of the same body and headers.
    assert_eq!(
        redis_field::write(&wire, true),
        golden("redis_queue_moved.field")
    );
}
