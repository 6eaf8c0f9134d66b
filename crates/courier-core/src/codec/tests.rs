//! The codec's tests: round trips, undecodable messages, the JSON forms.

use super::*;
use crate::{DelayStamp, Envelope, ErrorDetailsStamp, HandledStamp, ReceivedStamp};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Greet {
    who: String,
}
impl Message for Greet {
    const NAME: &'static str = "test.greet";
}

fn registry() -> MessageRegistry {
    MessageRegistry::new().with::<Greet>()
}

#[test]
fn a_hand_written_message_from_another_language_decodes() {
    let wire = Encoded::new(r#"{ "who": "wörld" }"#)
        .header("type", "test.greet")
        .header("content-type", "application/json")
        .header("x-courier-stamp-delay", "[250]")
        .header("x-trace", "abc");
    let env = registry().decode(wire);
    assert!(env.decode_error().is_none(), "{:?}", env.decode_error());
    assert_eq!(
        env.message::<Greet>(),
        Some(&Greet {
            who: "wörld".into()
        })
    );
    assert_eq!(
        env.last::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_millis(250)))
    );
    assert_eq!(
        env.extra_headers()
            .and_then(|h| h.get("x-trace"))
            .map(String::as_str),
        Some("abc")
    );
}

#[test]
fn encode_writes_sendable_stamps_as_json_lists_and_drops_local_ones() {
    let env = Envelope::new(Greet { who: "a".into() })
        .with(HandledStamp {
            handler: "h1".into(),
        })
        .with(HandledStamp {
            handler: "h2".into(),
        })
        .with(ReceivedStamp("async".into()));
    let wire = encode(&env).unwrap_or_default();
    assert_eq!(wire.body, r#"{"who":"a"}"#);
    assert_eq!(wire.headers["type"], "test.greet");
    assert_eq!(wire.headers["content-type"], "application/json");
    assert_eq!(
        wire.headers["x-courier-stamp-handled"],
        r#"[{"handler":"h1"},{"handler":"h2"}]"#
    );
    assert!(!wire.headers.contains_key("x-courier-stamp-received"));
}

#[test]
fn decode_then_encode_is_byte_for_byte() {
    let env = Envelope::new(Greet {
        who: "ünïcode ✓".into(),
    })
    .with(ErrorDetailsStamp::new("c", "m", vec!["x".into()]))
    .with(DelayStamp(Duration::from_millis(7)));
    let first = encode(&env).unwrap_or_default();
    let again = encode(&registry().decode(first.clone())).unwrap_or_default();
    assert_eq!(first, again);
}

#[test]
fn unknown_type_is_a_decode_error_naming_the_type() {
    let env = registry().decode(Encoded::new("{}").header("type", "nope.nope"));
    let err = env
        .decode_error()
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(err.contains("unknown message type `nope.nope`"), "{err}");
    assert_eq!(env.message_name(), "nope.nope");
}

#[test]
fn bad_json_is_a_decode_error_naming_the_type() {
    let env = registry().decode(Encoded::new("{not json").header("type", "test.greet"));
    assert!(
        matches!(env.decode_error(), Some(DecodeError::InvalidBody { name, .. }) if name == "test.greet")
    );
}

#[test]
fn missing_type_header_is_a_decode_error() {
    let env = registry().decode(Encoded::new(r#"{"who":"a"}"#));
    assert!(matches!(
        env.decode_error(),
        Some(DecodeError::MissingHeader { header: "type" })
    ));
}

#[test]
fn a_malformed_stamp_header_is_a_decode_error_naming_the_header() {
    let env = registry().decode(
        Encoded::new(r#"{"who":"a"}"#)
            .header("type", "test.greet")
            .header("x-courier-stamp-delay", "5"),
    );
    let err = env
        .decode_error()
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(err.contains("x-courier-stamp-delay"), "{err}");
}

#[test]
fn an_undecodable_message_encodes_back_to_its_raw_body() {
    let wire = Encoded::new("{not json").header("type", "test.greet");
    let env = registry().decode(wire);
    let again = encode(&env).unwrap_or_default();
    assert_eq!(again.body, "{not json");
    assert_eq!(again.headers["type"], "test.greet");
}

/// What the worker does to an undecodable envelope it moves to the failure transport.
fn moved_to_failure(env: Envelope) -> Envelope {
    env.with_error_details(ErrorDetailsStamp::new("decode", "undecodable", vec![]))
        .with(crate::SentToFailureTransportStamp::new("async"))
        .without_all::<DelayStamp>()
}

/// Poison messages as stored: body bytes and headers (`Err`: headers that are no map).
/// Stored headers: a map, or bytes that are no map.
type StoredHeaders = Result<BTreeMap<String, String>, Vec<u8>>;

fn poisons() -> Vec<(&'static str, Vec<u8>, StoredHeaders)> {
    let map = |pairs: &[(&str, &str)]| {
        Ok(pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect())
    };
    vec![
        (
            "content type",
            br#"{"who":"a"}"#.to_vec(),
            map(&[("type", "test.greet"), ("content-type", "text/plain")]),
        ),
        (
            "bad stamp header",
            br#"{"who":"a"}"#.to_vec(),
            map(&[
                ("type", "test.greet"),
                ("x-courier-stamp-redelivery", "{oops"),
            ]),
        ),
        (
            "bad stamp header beside a good one",
            br#"{"who":"a"}"#.to_vec(),
            map(&[
                ("type", "test.greet"),
                ("x-courier-stamp-handled", "nope"),
                ("x-courier-stamp-delay", "[5]"),
                ("x-extra", "kept"),
            ]),
        ),
        (
            "unknown type",
            br#"{"who":"a"}"#.to_vec(),
            map(&[
                ("type", "test.nobody"),
                ("content-type", "application/json"),
            ]),
        ),
        (
            "bad json",
            b"{not json".to_vec(),
            map(&[("type", "test.greet")]),
        ),
        ("no type", br#"{"who":"a"}"#.to_vec(), map(&[])),
        (
            "binary body",
            b"\xff\xfe{\"who\":\"a\"}".to_vec(),
            map(&[("type", "test.greet"), ("content-type", "application/json")]),
        ),
        (
            "unknown body encoding",
            br#"{"who":"a"}"#.to_vec(),
            map(&[("type", "test.greet"), ("x-courier-body-encoding", "gzip")]),
        ),
        (
            "base64 body that is not base64",
            br#"{"who":"a"}"#.to_vec(),
            map(&[
                ("type", "test.greet"),
                ("x-courier-body-encoding", "base64"),
            ]),
        ),
        (
            "headers not json",
            br#"{"who":"a"}"#.to_vec(),
            Err(b"not json".to_vec()),
        ),
        (
            "headers not text",
            b"\x80body".to_vec(),
            Err(b"{\"type\":\"test.greet\xff\"}".to_vec()),
        ),
    ]
}

fn stored(body: &[u8], headers: &StoredHeaders) -> Envelope {
    match headers {
        Ok(map) => registry().decode_bytes(body.to_vec(), map.clone()),
        Err(bytes) => registry()
            .json_decoder()
            .decode_bytes(body.to_vec(), Some(bytes)),
    }
}

#[test]
fn an_undecodable_message_moved_to_another_transport_comes_back_as_it_was() {
    let without_failure_stamps = |e: Envelope| {
        e.without_all::<ErrorDetailsStamp>()
            .without_all::<crate::SentToFailureTransportStamp>()
    };
    for (what, body, headers) in poisons() {
        let first = stored(&body, &headers);
        assert!(first.decode_error().is_some(), "{what}");
        assert_eq!(first.undecodable_body(), Some(&body[..]), "{what}");
        let sent = moved_to_failure(first.clone());
        // Through a transport that stores a header map (AMQP, in-memory) ...
        let wire = encode(&sent).unwrap_or_default();
        let back = registry().decode(wire.clone());
        // ... and one that stores the headers as one JSON text (SQL, Redis).
        let json = encode_json(&sent).unwrap_or_default();
        let back_json = registry().json_decoder().decode_bytes(
            json.body.clone().into_bytes(),
            Some(json.headers.as_bytes()),
        );
        for back in [back, back_json] {
            assert!(back.decode_error().is_some(), "{what}: still undecodable");
            assert_eq!(
                back.undecodable_body(),
                Some(&body[..]),
                "{what}: same bytes"
            );
            assert_eq!(back.message_name(), first.message_name(), "{what}");
            assert!(back.last::<ErrorDetailsStamp>().is_some(), "{what}");
            assert!(
                back.last::<crate::SentToFailureTransportStamp>().is_some(),
                "{what}"
            );
            assert_eq!(encode(&back).ok(), Some(wire.clone()), "{what}: stable");
            // Retried: the failure stamps go, the message is the one first stored.
            let retried = without_failure_stamps(back).without_all::<DelayStamp>();
            let again = registry().decode(encode(&retried).unwrap_or_default());
            assert!(
                again.decode_error().is_some(),
                "{what}: retried, still undecodable"
            );
            assert_eq!(again.undecodable_body(), Some(&body[..]), "{what}");
            if let Ok(original) = &headers {
                let mut expected = original.clone();
                expected.remove("x-courier-stamp-delay");
                if std::str::from_utf8(&body).is_err() {
                    // Bytes that are not text travel as base64, and say so.
                    expected.insert(BODY_ENCODING_HEADER.to_owned(), "base64".to_owned());
                }
                assert_eq!(
                    encode(&retried).map(|w| w.headers).ok(),
                    Some(expected),
                    "{what}: the headers as stored"
                );
            }
        }
    }
}

#[test]
fn a_body_that_is_not_utf8_is_named_and_travels_as_base64() {
    let env = registry()
        .json_decoder()
        .decode_bytes(vec![0xff, b'{', b'}'], Some(br#"{"type":"test.greet"}"#));
    assert!(
        matches!(env.decode_error(), Some(DecodeError::BodyNotText { .. })),
        "{:?}",
        env.decode_error()
    );
    let wire = encode(&env).unwrap_or_default();
    assert_eq!(wire.body, "/3t9");
    assert_eq!(wire.headers[BODY_ENCODING_HEADER], "base64");
    assert_eq!(wire.headers["type"], "test.greet");
}

#[test]
fn a_base64_body_from_a_producer_decodes() {
    let env = registry().decode(
        Encoded::new("eyJ3aG8iOiJiNjQifQ==")
            .header("type", "test.greet")
            .header(BODY_ENCODING_HEADER, "base64"),
    );
    assert_eq!(env.message::<Greet>(), Some(&Greet { who: "b64".into() }));
    let wire = encode(&env).unwrap_or_default();
    assert_eq!(wire.body, r#"{"who":"b64"}"#);
    assert!(!wire.headers.contains_key(BODY_ENCODING_HEADER));
}

#[test]
fn missing_headers_read_as_no_headers() {
    let env = registry()
        .json_decoder()
        .decode_bytes(br#"{"who":"a"}"#.to_vec(), None);
    assert!(matches!(
        env.decode_error(),
        Some(DecodeError::MissingHeader { header: "type" })
    ));
}

#[test]
fn headers_json_escapes_exactly_as_serde_json() {
    let mut text: String = (0u8..0x80).map(char::from).collect();
    text.push_str("ünïcode ✓ \u{2028} \u{1F600} \\ \" end");
    let mut map = BTreeMap::new();
    map.insert(text.clone(), text.clone());
    map.insert("b".to_owned(), String::new());
    map.insert("a".to_owned(), "\"quoted\"".to_owned());
    let wire = Encoded {
        body: String::new(),
        headers: map.clone(),
    };
    let expected = serde_json::to_string(&map).unwrap_or_default();
    assert_eq!(wire.headers_json(), expected);
    assert_eq!(Encoded::parse_headers(&expected).unwrap_or_default(), map);
}

fn with_everything() -> Envelope {
    let wire = Encoded::new(r#"{"who":"a"}"#)
        .header("type", "test.greet")
        .header("x-courier-stamp-delay", "[5]")
        .header("a-first", "1")
        .header("zz-last", "line\nbreak \"q\"")
        .header("x-courier-stamp-zzz-custom", r#"[{"k":"v"}]"#);
    registry()
        .decode(wire)
        .with(ErrorDetailsStamp::new("c", "m\"\n", vec!["x".into()]))
        .with(DelayStamp(Duration::from_millis(9)))
        .with(ReceivedStamp("local".into()))
}

#[test]
fn encode_json_is_the_same_text_as_encode_then_headers_json() {
    for env in [
        Envelope::new(Greet { who: "b".into() }),
        with_everything(),
        registry().decode(Encoded::new("{not json").header("type", "test.greet")),
        registry().decode(Encoded::new("{}").header("x-only", "extra")),
        registry().decode(Encoded::new("{}")),
        Envelope::new(Greet {
            who: "\"q\"\n".into(),
        })
        .with(ReceivedStamp("local".into())),
        registry().decode(Encoded::new(r#"{"who":"c"}"#).header("type", "test.greet")),
    ] {
        let slow = encode(&env).unwrap_or_default();
        let fast = encode_json(&env).map_err(|e| e.to_string());
        assert_eq!(
            fast,
            Ok(EncodedJson {
                body: slow.body.clone(),
                headers: slow.headers_json(),
            })
        );
    }
}

#[test]
fn encode_json_into_reuses_its_buffers_without_leftovers() {
    let mut out = EncodedJson::default();
    for env in [
        with_everything(),
        Envelope::new(Greet { who: "b".into() }),
        registry().decode(Encoded::new("{not json").header("type", "test.greet")),
        Envelope::new(Greet { who: "c".into() }),
    ] {
        assert!(encode_json_into(&env, &mut out).is_ok());
        assert_eq!(Some(&out), encode_json(&env).ok().as_ref());
    }
}

#[test]
fn an_extra_header_never_overrides_what_the_envelope_sets() {
    let mut extra = BTreeMap::new();
    extra.insert("type".to_owned(), "forged".to_owned());
    extra.insert("content-type".to_owned(), "text/plain".to_owned());
    extra.insert("x-courier-stamp-delay".to_owned(), "[1]".to_owned());
    let mut env =
        Envelope::new(Greet { who: "a".into() }).with(DelayStamp(Duration::from_millis(2)));
    env.extra_headers = Some(Arc::new(extra));
    let wire = encode(&env).unwrap_or_default();
    assert_eq!(wire.headers["type"], "test.greet");
    assert_eq!(wire.headers["content-type"], "application/json");
    assert_eq!(wire.headers["x-courier-stamp-delay"], "[2]");
    assert_eq!(
        encode_json(&env).map(|w| w.headers).unwrap_or_default(),
        wire.headers_json()
    );
}

#[test]
fn decode_json_reads_what_decode_reads() {
    let env = with_everything();
    let wire = encode(&env).unwrap_or_default();
    let slow = registry().decode(wire.clone());
    let fast = registry().decode_json(wire.body.clone(), &wire.headers_json());
    assert!(fast.decode_error().is_none(), "{:?}", fast.decode_error());
    assert_eq!(
        encode(&fast).unwrap_or_default(),
        encode(&slow).unwrap_or_default()
    );
    assert_eq!(fast.extra_headers(), slow.extra_headers());
    assert_eq!(fast.message::<Greet>(), Some(&Greet { who: "a".into() }));
}

#[test]
fn decode_json_names_headers_that_are_not_an_object_of_strings() {
    for bad in ["", "[]", r#"{"type": 5}"#, r#"{"type":"test.greet""#] {
        let env = registry().decode_json(r#"{"who":"a"}"#.to_owned(), bad);
        assert!(
            matches!(env.decode_error(), Some(DecodeError::InvalidHeaders { .. })),
            "{bad:?}: {:?}",
            env.decode_error()
        );
        assert_eq!(
            encode(&env).map(|w| w.body).unwrap_or_default(),
            r#"{"who":"a"}"#
        );
    }
}

/// What a [`JsonDecoder`] gives, as text: the decode error or the re-encoded wire form.
fn outcome(env: &Envelope) -> String {
    match env.decode_error() {
        Some(e) => format!("error: {e}"),
        None => format!("{:?}", encode(env).unwrap_or_default()),
    }
}

#[test]
fn a_json_decoder_gives_what_decode_json_gives_for_every_run_of_headers() {
    let with_stamps = encode(&with_everything())
        .unwrap_or_default()
        .headers_json();
    let plain = r#"{"content-type":"application/json","type":"test.greet"}"#.to_owned();
    let unknown = r#"{"type":"test.nobody"}"#.to_owned();
    let bad_stamp = r#"{"type":"test.greet","x-courier-stamp-delay":"nope"}"#.to_owned();
    let runs = [
        (&plain, r#"{"who":"a"}"#),
        (&plain, r#"{"who":"b"}"#),
        (&plain, r#"{"who":5}"#),
        (&plain, r#"{"who":"c"}"#),
        (&with_stamps, r#"{"who":"d"}"#),
        (&with_stamps, r#"{"who":"e"}"#),
        (&unknown, r#"{"who":"f"}"#),
        (&unknown, r#"{"who":"g"}"#),
        (&bad_stamp, r#"{"who":"h"}"#),
        (&plain, r#"{"who":"i"}"#),
    ];
    let registry = registry();
    let mut decoder = registry.json_decoder();
    for (headers, body) in runs {
        let batch = decoder.decode(body.to_owned(), headers);
        let alone = registry.decode_json(body.to_owned(), headers);
        assert_eq!(outcome(&batch), outcome(&alone), "{headers} {body}");
        assert_eq!(batch.extra_headers(), alone.extra_headers());
        assert_eq!(batch.message::<Greet>(), alone.message::<Greet>());
    }
}

#[test]
fn envelopes_from_one_json_decoder_do_not_share_stamps() {
    let headers = encode(&with_everything())
        .unwrap_or_default()
        .headers_json();
    let registry = registry();
    let mut decoder = registry.json_decoder();
    let first = decoder
        .decode(r#"{"who":"a"}"#.to_owned(), &headers)
        .with(DelayStamp(Duration::from_secs(9)));
    let second = decoder.decode(r#"{"who":"b"}"#.to_owned(), &headers);
    assert_eq!(
        first.last::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_secs(9)))
    );
    assert_ne!(
        second.last::<DelayStamp>(),
        Some(&DelayStamp(Duration::from_secs(9)))
    );
    assert_eq!(second.message::<Greet>(), Some(&Greet { who: "b".into() }));
}

/// The compact reading of a headers object gives what the JSON parser gives, or leaves the text
/// to it: escapes, spaces, other values, broken text.
#[test]
fn header_pairs_read_compact_objects_as_the_parser_does() {
    fn parsed(json: &str) -> Option<Vec<HeaderPair<'_>>> {
        use serde::Deserializer as _;
        let mut de = serde_json::Deserializer::from_str(json);
        let pairs = (&mut de).deserialize_map(decode::PairVisitor {
            make: Vec::with_capacity,
            push: |pairs: &mut Vec<_>, k, v| pairs.push((k, v)),
        });
        pairs.and_then(|p| de.end().map(|()| p)).ok()
    }
    let compact = [
        "{}",
        r#"{"content-type":"application/json","type":"app.ping"}"#,
        r#"{"a":"","":"b","a":"dup"}"#,
        r#"{"x-courier-stamp-delay":"[{\"ms\":5}]"}"#,
        r#"{"type":"caf\u00e9 ünï"}"#,
    ];
    let other = [
        r#"{ "a": "b" }"#,
        r#"{"a":1}"#,
        r#"{"a":"b",}"#,
        r#"{"a":"b""c":"d"}"#,
        r#"{"a":"b"} "#,
        r#"{"a":"b"}}"#,
        "{\"a\":\"b\tc\"}",
        r#"{"a""#,
        r#"["a","b"]"#,
        "",
    ];
    for json in compact.iter().chain(&other) {
        let read = header_pairs(json).ok();
        assert_eq!(read, parsed(json), "{json}");
    }
    // Courier's own writing takes the short way, borrowed; an escape goes to the parser.
    assert!(decode::compact_pairs(compact[1]).is_some());
    assert!(decode::compact_pairs(compact[3]).is_none());
    assert!(decode::compact_pairs(other[0]).is_none());
    let pairs = header_pairs(compact[1]).expect("pairs");
    assert!(matches!(pairs[1].1, std::borrow::Cow::Borrowed("app.ping")));
}
