//! [`SymfonySerializer`]: Symfony Messenger's JSON `Serializer` format to Courier's wire form and
//! back.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono_tz::Tz;
use courier_core::{
    CONTENT_TYPE_HEADER, EncodeError, Encoded, EncodedJson, Envelope, JSON_CONTENT_TYPE,
    MessageRegistry, STAMP_HEADER_PREFIX, TYPE_HEADER, encode_json_into, header_pairs,
};

use crate::php_envelope;
use crate::php_json::{php_escape, php_escaped, php_object};
use crate::stamps::{Mapped, SYMFONY_STAMP_PREFIX};
use crate::types::SymfonyTypes;

/// Symfony's content type header (Courier's is lowercase).
const SYMFONY_CONTENT_TYPE: &str = "Content-Type";

/// The plain header naming why a body without a `type` header could not be read as a
/// `PhpSerializer` envelope (PHP ignores it; `courier failed show` lists it).
pub const PHP_DECODE_ERROR_HEADER: &str = "x-courier-symfony-decode-error";

/// A message in Symfony's wire form: the body and the headers in the order Symfony writes them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SymfonyEncoded {
    /// The body: the message as JSON (PHP's property names and escapes).
    pub body: String,
    /// `type`, the `X-Message-Stamp-<FQCN>` headers, Courier's own plain headers and
    /// `Content-Type`, in that order.
    pub headers: Vec<(String, String)>,
}

impl SymfonyEncoded {
    /// The headers as PHP's `json_encode` writes them (the Doctrine `headers` column, the Redis
    /// `headers` field): `[]` when there are none.
    #[must_use]
    pub fn headers_json(&self) -> String {
        php_object(self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// Reads and writes Symfony Messenger's JSON serializer format (`messenger.transport.symfony_serializer`)
/// and reads its `PhpSerializer` envelopes.
///
/// - the body is the message as JSON, with PHP's property names (name the Rust fields with
///   `#[serde(rename_all = "camelCase")]` or `#[serde(rename)]`);
/// - the `type` header is the PHP class, mapped to the wire name by [`SymfonyTypes`];
/// - `DelayStamp`, `RedeliveryStamp`, `ErrorDetailsStamp`, `SentToFailureTransportStamp` and
///   `BusNameStamp` become Courier's stamps and back; every other `X-Message-Stamp-*` header
///   (and `TransportMessageIdStamp`) travels verbatim;
/// - Courier's own stamps stay in its lowercase `x-courier-stamp-*` headers, which PHP ignores
///   (a `X-Message-Stamp-*` header naming a class PHP does not know fails its decoding).
///
/// ```
/// use courier_core::{Envelope, Message, MessageRegistry, RedeliveryStamp};
/// use courier_symfony::{SymfonySerializer, SymfonyTypes};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct SendEmail { to: String, retry_after: u32 }
/// impl Message for SendEmail { const NAME: &'static str = "mail.send"; }
///
/// let registry = MessageRegistry::new().with::<SendEmail>();
/// let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send"));
/// let headers = r#"{"type":"App\\Message\\SendEmail","X-Message-Stamp-Symfony\\Component\\Messenger\\Stamp\\RedeliveryStamp":"[{\"retryCount\":1,\"redeliveredAt\":\"2024-05-06T07:08:09+00:00\"}]","Content-Type":"application\/json"}"#;
/// let envelope = serializer.decode(&registry, r#"{"to":"a@example.com","retryAfter":5}"#.into(), headers);
/// assert_eq!(envelope.message::<SendEmail>().map(|m| m.retry_after), Some(5));
/// assert_eq!(envelope.last::<RedeliveryStamp>().map(|s| s.retry_count), Some(1));
///
/// let wire = serializer.encode(&registry, &Envelope::new(SendEmail { to: "b@example.com".into(), retry_after: 0 }))?;
/// assert_eq!(wire.body, r#"{"to":"b@example.com","retryAfter":0}"#);
/// assert_eq!(wire.headers_json(), r#"{"type":"App\\Message\\SendEmail","Content-Type":"application\/json"}"#);
/// # Ok::<(), courier_core::EncodeError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SymfonySerializer {
    types: SymfonyTypes,
    zone: Tz,
}

impl SymfonySerializer {
    /// A serializer with these class mappings, writing datetimes in UTC.
    #[must_use]
    pub fn new(types: SymfonyTypes) -> Self {
        Self {
            types,
            zone: Tz::UTC,
        }
    }

    /// Writes the datetimes of stamps (`RedeliveryStamp::redeliveredAt`) in PHP's time zone, as
    /// PHP does.
    #[must_use]
    pub fn with_zone(mut self, zone: Tz) -> Self {
        self.zone = zone;
        self
    }

    /// The class mappings.
    #[must_use]
    pub fn types(&self) -> &SymfonyTypes {
        &self.types
    }

    /// The time zone datetimes are written in.
    #[must_use]
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// Decodes a message stored in Symfony's form: its body and its headers as one JSON object
    /// (or `[]`, as PHP stores no headers). Never fails: a message that does not decode comes
    /// back as an envelope whose [`Envelope::decode_error`] says why (an unmapped class names
    /// the class), body and headers kept, for the failure transport.
    #[must_use]
    pub fn decode(&self, registry: &MessageRegistry, body: String, headers_json: &str) -> Envelope {
        let pairs = if headers_json.trim() == "[]" {
            Some(Vec::new())
        } else {
            header_pairs(headers_json).ok()
        };
        match pairs {
            // A `PhpSerializer` envelope: its own way, through the header map.
            Some(pairs) if php_envelope_body(&body, &pairs) => {
                let headers = owned(pairs).into_iter().collect();
                registry.decode(self.to_courier(body, headers))
            }
            // Borrowed from the headers' text where they can be, with no header map.
            Some(pairs) => registry.decode_pairs(body, self.courier_headers(pairs)),
            // Not an object of strings: the registry says so, keeping both.
            None => registry.decode_json(body, headers_json),
        }
    }

    /// Symfony's wire form to Courier's (see the type's documentation). A body with no `type`
    /// header is read as a `PhpSerializer` envelope.
    #[must_use]
    pub fn to_courier(&self, body: String, headers: BTreeMap<String, String>) -> Encoded {
        if !headers.contains_key(TYPE_HEADER) && php_envelope::looks_like_php_envelope(&body) {
            return match php_envelope::read(&body) {
                Ok(php) => {
                    let mut headers = headers;
                    headers.insert(TYPE_HEADER.to_owned(), php.class);
                    headers.insert(
                        SYMFONY_CONTENT_TYPE.to_owned(),
                        JSON_CONTENT_TYPE.to_owned(),
                    );
                    headers.extend(php.stamp_headers);
                    self.to_courier(php.body, headers)
                }
                Err(e) => Encoded {
                    body,
                    headers: BTreeMap::from([(PHP_DECODE_ERROR_HEADER.to_owned(), e.to_string())]),
                },
            };
        }
        Encoded {
            body,
            headers: owned(self.courier_headers(pairs_of(headers)))
                .into_iter()
                .collect(),
        }
    }

    /// Symfony's headers as Courier's, sorted by name with no name twice, as a header map holds
    /// them: of two that map to one name, the later in name order wins.
    fn courier_headers<'a>(&'a self, mut headers: Vec<Pair<'a>>) -> Vec<Pair<'a>> {
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<Pair<'a>> = Vec::with_capacity(headers.len() + 1);
        for (name, value) in headers {
            if name == TYPE_HEADER {
                let wire = match value {
                    Cow::Borrowed(class) => {
                        Cow::Borrowed(self.types.wire_name(class).unwrap_or(class))
                    }
                    Cow::Owned(class) => self
                        .types
                        .wire_name(&class)
                        .map_or(Cow::Owned(class), Cow::Borrowed),
                };
                out.push((name, wire));
            } else if name.eq_ignore_ascii_case(SYMFONY_CONTENT_TYPE) {
                out.push((Cow::Borrowed(CONTENT_TYPE_HEADER), value));
            } else if let Some(class) = name.strip_prefix(SYMFONY_STAMP_PREFIX) {
                let mapped = Mapped::by_php_class(class).and_then(|m| {
                    let courier = m.to_courier(&value)?;
                    Some((
                        format!("{STAMP_HEADER_PREFIX}{}", m.courier_name()?),
                        courier,
                    ))
                });
                match mapped {
                    Some((courier_name, courier)) => {
                        out.push((Cow::Owned(courier_name), Cow::Owned(courier)));
                    }
                    None => out.push((name, value)),
                }
            } else {
                out.push((name, value));
            }
        }
        if !out.iter().any(|(name, _)| name == CONTENT_TYPE_HEADER) {
            out.push((
                Cow::Borrowed(CONTENT_TYPE_HEADER),
                Cow::Borrowed(JSON_CONTENT_TYPE),
            ));
        }
        // Stable: of equal names the later stays after the earlier, and wins.
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<Pair<'a>> = Vec::with_capacity(out.len());
        for pair in out {
            if unique.last().is_some_and(|(name, _)| *name == pair.0) {
                unique.pop();
            }
            unique.push(pair);
        }
        unique
    }

    /// Encodes an envelope in Symfony's form: what PHP's `messenger.transport.symfony_serializer`
    /// decodes.
    ///
    /// # Errors
    /// [`EncodeError`] if the message does not serialize.
    pub fn encode(
        &self,
        registry: &MessageRegistry,
        envelope: &Envelope,
    ) -> Result<SymfonyEncoded, EncodeError> {
        let mut buf = EncodedJson::default();
        self.encode_into_with(registry, envelope, &mut buf, |body, headers| {
            SymfonyEncoded {
                body: body.to_owned(),
                headers: owned(headers),
            }
        })
    }

    /// [`Self::encode`], handing `write` the body and the headers in Symfony's order, borrowed
    /// where they can be (a transport writing them straight into its own buffer builds no
    /// [`SymfonyEncoded`]). Courier's text goes through `buf`, buffers a batch reuses from one
    /// message to the next; its headers are read back borrowed: no header map and no header
    /// name built per message (what `registry.encode` would give, cheaper).
    pub(crate) fn encode_into_with<R>(
        &self,
        registry: &MessageRegistry,
        envelope: &Envelope,
        buf: &mut EncodedJson,
        write: impl FnOnce(&str, Vec<Pair<'_>>) -> R,
    ) -> Result<R, EncodeError> {
        encode_json_into(envelope, buf)?;
        match header_pairs(&buf.headers) {
            Ok(pairs) => Ok(write(&php_escaped(&buf.body), self.symfony_headers(pairs))),
            // Never taken (Courier wrote the object); the header map's way stays correct.
            Err(_) => {
                let Encoded { body, headers } = registry.encode(envelope)?;
                Ok(write(
                    &php_escape(body),
                    self.symfony_headers(pairs_of(headers)),
                ))
            }
        }
    }

    /// Courier's wire form to Symfony's (see the type's documentation).
    #[must_use]
    pub fn to_symfony(&self, encoded: Encoded) -> SymfonyEncoded {
        let Encoded { body, headers } = encoded;
        SymfonyEncoded {
            body: php_escape(body),
            headers: owned(self.symfony_headers(pairs_of(headers))),
        }
    }

    /// Courier's headers (sorted by name) as Symfony's, in the order Symfony writes them.
    fn symfony_headers<'a>(&'a self, mut headers: Vec<Pair<'a>>) -> Vec<Pair<'a>> {
        let mut out = Vec::with_capacity(headers.len() + 1);
        if let Some(name) = take(&mut headers, TYPE_HEADER) {
            let class = match name {
                Cow::Borrowed(name) => Cow::Borrowed(self.types.php_class(name).unwrap_or(name)),
                Cow::Owned(name) => self
                    .types
                    .php_class(&name)
                    .map_or(Cow::Owned(name), Cow::Borrowed),
            };
            out.push((Cow::Borrowed(TYPE_HEADER), class));
        }
        let content_type = take(&mut headers, CONTENT_TYPE_HEADER);
        // Most messages carry no stamp header: no names to build then.
        let stamped = headers.iter().any(|(name, _)| {
            name.starts_with(STAMP_HEADER_PREFIX) || name.starts_with(SYMFONY_STAMP_PREFIX)
        });
        for mapped in Mapped::ALL.into_iter().filter(|_| stamped) {
            let symfony_name = format!("{SYMFONY_STAMP_PREFIX}{}", mapped.php_class());
            let converted = mapped.courier_name().and_then(|name| {
                let courier_name = format!("{STAMP_HEADER_PREFIX}{name}");
                let at = headers.iter().position(|(k, _)| *k == courier_name)?;
                let list = mapped.to_symfony(&headers[at].1, self.zone)?;
                headers.remove(at);
                Some(Cow::Owned(list))
            });
            let verbatim = || take(&mut headers, &symfony_name);
            if let Some(list) = converted.or_else(verbatim) {
                out.push((Cow::Owned(symfony_name), list));
            }
        }
        // Stamps Courier does not know (verbatim), then Courier's own plain headers, each in
        // its order (a stable sort, in place).
        headers.sort_by_key(|(name, _)| !name.starts_with(SYMFONY_STAMP_PREFIX));
        out.extend(headers);
        out.push((
            Cow::Borrowed(SYMFONY_CONTENT_TYPE),
            content_type.unwrap_or(Cow::Borrowed(JSON_CONTENT_TYPE)),
        ));
        out
    }
}

/// A header map as pairs.
fn pairs_of(headers: BTreeMap<String, String>) -> Vec<Pair<'static>> {
    headers
        .into_iter()
        .map(|(k, v)| (Cow::Owned(k), Cow::Owned(v)))
        .collect()
}

/// The pairs as owned strings.
fn owned(pairs: Vec<Pair<'_>>) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Removes the header `name` and gives its value.
fn take<'a>(headers: &mut Vec<Pair<'a>>, name: &str) -> Option<Cow<'a, str>> {
    let at = headers.iter().position(|(k, _)| k == name)?;
    Some(headers.remove(at).1)
}

/// A header's name and value, borrowed from the JSON text where it needs no unescaping.
pub(crate) type Pair<'a> = courier_core::HeaderPair<'a>;

/// Whether a message is a `PhpSerializer` envelope: no `type` header, and a body that looks
/// like one.
fn php_envelope_body(body: &str, headers: &[Pair<'_>]) -> bool {
    !headers.iter().any(|(name, _)| name == TYPE_HEADER)
        && php_envelope::looks_like_php_envelope(body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use courier_core::{
        BusNameStamp, DelayStamp, ErrorDetailsStamp, Message, MessageIdStamp, RedeliveryStamp,
    };
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Ping {
        to: String,
    }

    impl Message for Ping {
        const NAME: &'static str = "app.ping";
    }

    /// `decode` reads Symfony's headers borrowed, without a header map; it gives what the header
    /// map's way (`to_courier`, then `registry.decode`) gives, for every kind of header, names
    /// that map to one name included.
    #[test]
    fn decode_gives_what_the_header_map_gives() {
        let registry = MessageRegistry::new().with::<Ping>();
        let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Ping", "app.ping"));
        let body = r#"{"to":"x\/y"}"#;
        for headers in [
            r#"{"type":"App\\Ping","Content-Type":"application\/json"}"#,
            r#"{"type":"App\\Ping","X-Message-Stamp-Symfony\\Component\\Messenger\\Stamp\\RedeliveryStamp":"[{\"retryCount\":1,\"redeliveredAt\":\"2024-05-06T07:08:09+00:00\"}]","X-Message-Stamp-Symfony\\Component\\Messenger\\Stamp\\BusNameStamp":"[{\"busName\":\"messenger.bus.default\"}]","X-Message-Stamp-App\\Stamp\\Custom":"[{\"k\":\"v\"}]","x-trace":"t1","Content-Type":"application\/json"}"#,
            r#"{"type":"App\\Other","Content-Type":"text\/plain","content-type":"application\/json"}"#,
            r#"{"type":"app.ping","type":"App\\Ping"}"#,
            r#"{"type":"App\\Ping","x-courier-stamp-bus-name":"[\"a\"]","X-Message-Stamp-Symfony\\Component\\Messenger\\Stamp\\BusNameStamp":"[{\"busName\":\"b\"}]"}"#,
            "[]",
        ] {
            let fast = serializer.decode(&registry, body.to_owned(), headers);
            let map: BTreeMap<String, String> = if headers == "[]" {
                BTreeMap::new()
            } else {
                serde_json::from_str(headers).unwrap()
            };
            let mapped = registry.decode(serializer.to_courier(body.to_owned(), map));
            assert_eq!(
                fast.decode_error().map(ToString::to_string),
                mapped.decode_error().map(ToString::to_string),
                "{headers}"
            );
            assert_eq!(
                registry.encode(&fast).unwrap(),
                registry.encode(&mapped).unwrap(),
                "{headers}"
            );
            assert_eq!(
                fast.stamp_names().collect::<Vec<_>>(),
                mapped.stamp_names().collect::<Vec<_>>(),
                "{headers}"
            );
        }
    }

    /// `encode` reads Courier's headers back from their JSON text; it writes what the header map
    /// of `registry.encode` gives, for every kind of header, and so does the Redis transport's
    /// field written from the borrowed headers.
    #[test]
    fn encode_writes_what_the_header_map_gives() {
        let registry = MessageRegistry::new().with::<Ping>();
        let serializer = SymfonySerializer::new(SymfonyTypes::new().map(r"App\Ping", "app.ping"));
        let mut buf = EncodedJson::default();
        #[cfg(feature = "redis")]
        let mut json = String::new();
        let ping = || {
            Envelope::new(Ping {
                to: "a/é\"b".into(),
            })
        };
        let from_php = serializer.decode(
            &registry,
            r#"{"to":"x"}"#.to_owned(),
            r#"{"type":"App\\Ping","X-Message-Stamp-App\\Stamp\\Custom":"[{\"k\":\"v\"}]","x-trace":"t\"1","Content-Type":"application\/json"}"#,
        );
        let unmapped = serializer.decode(
            &registry,
            r#"{"to":"x"}"#.to_owned(),
            r#"{"type":"App\\Other","Content-Type":"application\/json"}"#,
        );
        for envelope in [
            ping(),
            ping().with(MessageIdStamp::new()),
            ping()
                .with(BusNameStamp("messenger.bus.default".into()))
                .with(DelayStamp(Duration::from_millis(1500)))
                .with(RedeliveryStamp {
                    retry_count: 2,
                    at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
                })
                .with_error_details(ErrorDetailsStamp {
                    class: "Timeout".into(),
                    message: "took \"too\" long/ü".into(),
                    chain: vec!["inner".into()],
                }),
            from_php,
            unmapped,
        ] {
            let fast = serializer.encode(&registry, &envelope).unwrap();
            let mapped = serializer.to_symfony(registry.encode(&envelope).unwrap());
            assert_eq!(fast, mapped);
            // The Redis transport's field, written from the borrowed headers, through buffers
            // reused from one envelope to the next.
            for php in [true, false] {
                let field = serializer
                    .encode_into_with(&registry, &envelope, &mut buf, |body, headers| {
                        crate::redis_field::write_parts(
                            body,
                            headers.iter().map(|(k, v)| (&**k, &**v)),
                            php,
                        )
                    })
                    .unwrap();
                assert_eq!(field, crate::redis_field::write(&mapped, php));
                #[cfg(feature = "redis")]
                {
                    // As a command's argument, written straight into the command.
                    serializer
                        .encode_into_with(&registry, &envelope, &mut buf, |body, headers| {
                            crate::redis_field::write_json(
                                &mut json,
                                body,
                                headers.iter().map(|(k, v)| (&**k, &**v)),
                            );
                        })
                        .unwrap();
                    let mut cmd = redis::Cmd::new();
                    cmd.arg("XADD").arg(crate::redis_field::FieldArg {
                        json: &json,
                        php_serialized: php,
                    });
                    let args: Vec<&[u8]> = cmd
                        .args_iter()
                        .filter_map(|arg| match arg {
                            redis::Arg::Simple(bytes) => Some(bytes),
                            _ => None,
                        })
                        .collect();
                    assert_eq!(args, [&b"XADD"[..], field.as_bytes()]);
                }
            }
        }
    }
}
