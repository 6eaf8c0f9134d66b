//! [`NatsOptions`]: stream, subject, consumer and timings, built in code or read from a DSN.

use std::time::Duration;

use courier_core::Dsn;

/// Where JetStream keeps the stream's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StorageType {
    /// On disk (the default): messages survive a server restart.
    #[default]
    File,
    /// In memory: faster, lost when the server restarts.
    Memory,
}

impl std::str::FromStr for StorageType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "file" => Ok(Self::File),
            "memory" => Ok(Self::Memory),
            other => Err(format!(
                "unknown storage `{other}` (expected file or memory)"
            )),
        }
    }
}

/// Options of a [`NatsTransport`](crate::NatsTransport).
///
/// DSN form (every option optional):
///
/// ```text
/// nats://user:pass@host:4222/STREAM?subject=orders.messages&consumer=courier
///     &delay_subject=orders.messages.delayed&max_delayed=100000
///     &ack_wait=30s&max_ack_pending=10000&poll_window=1s&request_timeout=10s
///     &connect_timeout=5s&max_backoff=5s&auto_setup=true&duplicate_window=2min
///     &storage=file&replicas=1&serializer=json&token=SECRET
/// ```
///
/// The stream is the DSN's path (`/orders`) or `?stream=orders`, else the transport's name; the subject
/// defaults to `<stream>.messages`, the durable consumer to `courier`. Delayed messages wait on
/// `delay_subject` (default `<subject>.delayed`, in the same stream) for a durable consumer of
/// their own, `<consumer>-delayed`, which holds at most `max_delayed` of them at once. `token`
/// authenticates with a token instead of `user:pass` (it is redacted wherever the DSN is
/// shown).
#[derive(Clone, PartialEq, Eq)]
pub struct NatsOptions {
    pub(crate) stream: String,
    pub(crate) subject: String,
    pub(crate) consumer: String,
    /// `None`: `<subject>.delayed`.
    pub(crate) delay_subject: Option<String>,
    pub(crate) max_delayed: u32,
    pub(crate) ack_wait: Duration,
    pub(crate) max_ack_pending: u32,
    pub(crate) poll_window: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) auto_setup: bool,
    pub(crate) duplicate_window: Duration,
    pub(crate) storage: StorageType,
    pub(crate) replicas: u8,
    pub(crate) serializer: courier_core::Serializer,
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsOptions")
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("consumer", &self.consumer)
            .field("delay_subject", &self.delay_subject_name())
            .field("max_delayed", &self.max_delayed)
            .field("ack_wait", &self.ack_wait)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("poll_window", &self.poll_window)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_backoff", &self.max_backoff)
            .field("auto_setup", &self.auto_setup)
            .field("duplicate_window", &self.duplicate_window)
            .field("storage", &self.storage)
            .field("replicas", &self.replicas)
            .field("serializer", &self.serializer)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

const KNOWN: &[&str] = &[
    "stream",
    "subject",
    "consumer",
    "delay_subject",
    "max_delayed",
    "ack_wait",
    "max_ack_pending",
    "poll_window",
    "request_timeout",
    "connect_timeout",
    "max_backoff",
    "auto_setup",
    "duplicate_window",
    "storage",
    "replicas",
    "serializer",
    "token",
];

impl NatsOptions {
    /// Defaults for the stream `stream`: subject `<stream>.messages`, durable consumer
    /// `courier`, delayed messages on `<subject>.delayed` (at most 100 000 held at once), ack
    /// wait 30 s, at most 10 000 unacked deliveries, poll window 1 s, request
    /// timeout 10 s, connect timeout 5 s, reconnect backoff capped at 5 s, auto setup, a 2 min
    /// duplicate window, file storage, one replica.
    #[must_use]
    pub fn new(stream: impl Into<String>) -> Self {
        let stream = stream.into();
        Self {
            subject: format!("{stream}.messages"),
            stream,
            consumer: "courier".into(),
            delay_subject: None,
            max_delayed: 100_000,
            ack_wait: Duration::from_secs(30),
            max_ack_pending: 10_000,
            poll_window: Duration::from_secs(1),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            auto_setup: true,
            duplicate_window: Duration::from_secs(120),
            storage: StorageType::File,
            replicas: 1,
            serializer: courier_core::Serializer::Json,
            token: None,
        }
    }

    /// The subject messages are published to (default `<stream>.messages`).
    #[must_use]
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = subject.into();
        self
    }

    /// The durable pull consumer's name (default `courier`).
    #[must_use]
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = consumer.into();
        self
    }

    /// The redelivery window (JetStream's `ack_wait`, default 30 s): a delivery neither acked
    /// nor kept alive for this long is delivered again.
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// How many deliveries may be unacked at once (JetStream's `max_ack_pending` of the
    /// consumer workers pull from, default 10 000). Delayed messages do not count towards it:
    /// they wait on the delay subject.
    #[must_use]
    pub fn max_ack_pending(mut self, max: u32) -> Self {
        self.max_ack_pending = max.max(1);
        self
    }

    /// The subject delayed messages wait on until they are due (default `<subject>.delayed`);
    /// the stream captures it beside the subject, and it must differ from it.
    #[must_use]
    pub fn delay_subject(mut self, subject: impl Into<String>) -> Self {
        self.delay_subject = Some(subject.into());
        self
    }

    /// How many delayed messages the delay consumer holds at once, waiting for their time
    /// (its `max_ack_pending`, default 100 000). Past it, further delayed messages stay unread
    /// in the stream until held ones are due and move on: never early, never lost, but a short
    /// delay sent behind this many longer ones is late. Each held message costs the server a
    /// pending entry (memory, and the consumer's state on disk).
    #[must_use]
    pub fn max_delayed(mut self, max: u32) -> Self {
        self.max_delayed = max.max(1);
        self
    }

    /// How long `get` waits for a first message (default 1 s).
    #[must_use]
    pub fn poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
        self
    }

    /// How long a publish waits for its PubAck, and an ack or an API call for its answer
    /// (default 10 s).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 5 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The cap of the reconnect backoff (default 5 s; it starts at 100 ms and doubles).
    #[must_use]
    pub fn max_backoff(mut self, cap: Duration) -> Self {
        self.max_backoff = cap;
        self
    }

    /// Whether the stream and the consumer are created (or updated) on connect (default true).
    #[must_use]
    pub fn auto_setup(mut self, auto_setup: bool) -> Self {
        self.auto_setup = auto_setup;
        self
    }

    /// The stream's duplicate window (default 2 min): a second publish with the same
    /// `Nats-Msg-Id` within it is stored once.
    #[must_use]
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Where the stream keeps its messages (default [`StorageType::File`]).
    #[must_use]
    pub fn storage(mut self, storage: StorageType) -> Self {
        self.storage = storage;
        self
    }

    /// The stream's replica count (default 1; 1 to 5 in a cluster).
    #[must_use]
    pub fn replicas(mut self, replicas: u8) -> Self {
        self.replicas = replicas.clamp(1, 5);
        self
    }

    /// Sets the body serializer (`json` by default, or `msgpack`: see
    /// [`Serializer`](courier_core::Serializer)); consumers decode by each message's content type.
    #[must_use]
    pub fn serializer(mut self, serializer: courier_core::Serializer) -> Self {
        self.serializer = serializer;
        self
    }

    /// Authenticates with a token (never shown in `Debug`).
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The stream's name.
    #[must_use]
    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// The subject messages are published to.
    #[must_use]
    pub fn subject_name(&self) -> &str {
        &self.subject
    }

    /// The durable consumer's name.
    #[must_use]
    pub fn consumer_name(&self) -> &str {
        &self.consumer
    }

    /// The subject delayed messages wait on (default `<subject>.delayed`).
    #[must_use]
    pub fn delay_subject_name(&self) -> String {
        self.delay_subject
            .clone()
            .unwrap_or_else(|| format!("{}.delayed", self.subject))
    }

    /// The durable consumer delayed messages wait on: `<consumer>-delayed`.
    #[must_use]
    pub fn delay_consumer_name(&self) -> String {
        format!("{}-delayed", self.consumer)
    }

    /// Checks the names JetStream restricts: the stream and the consumer (no whitespace, `.`,
    /// `*`, `>`, path separators or control characters, at most 255 characters) and the
    /// subject (dot-separated non-empty tokens, no whitespace, no wildcards).
    ///
    /// # Errors
    /// A message naming the option and the culprit.
    pub fn validate(&self) -> Result<(), String> {
        check_name("stream", &self.stream)?;
        check_name("consumer", &self.consumer)?;
        check_name("delay consumer", &self.delay_consumer_name())?;
        check_subject("subject", &self.subject)?;
        let delay_subject = self.delay_subject_name();
        check_subject("delay_subject", &delay_subject)?;
        if delay_subject == self.subject {
            return Err(format!(
                "option `delay_subject` must differ from `subject` (both are `{delay_subject}`)"
            ));
        }
        if self.ack_wait.is_zero() {
            return Err("option `ack_wait` must be longer than zero".into());
        }
        Ok(())
    }

    /// Reads the options of the transport `name` from a DSN (see the type docs).
    ///
    /// # Errors
    /// A message naming the unknown option, the bad value or the invalid name.
    pub fn from_dsn(name: &str, dsn: &Dsn) -> Result<Self, String> {
        let path = dsn.path().trim_matches('/');
        let stream = match (path, dsn.option("stream")) {
            ("", None) => name,
            ("", Some(option)) => option,
            (path, None) => path,
            (path, Some(option)) if path == option => path,
            (path, Some(option)) => {
                return Err(format!(
                    "the stream is named twice: `{path}` in the path, `{option}` in `?stream=`"
                ));
            }
        };
        let mut o = Self::new(stream);
        let mut subject = None;
        for (key, value) in dsn.options() {
            let bad = |what: &str| format!("invalid value `{value}` for option `{key}`: {what}");
            let duration = || humantime::parse_duration(value).map_err(|e| bad(&e.to_string()));
            let boolean = || {
                value
                    .parse::<bool>()
                    .map_err(|_| bad("expected true or false"))
            };
            match key.as_str() {
                "stream" => {}
                "subject" => subject = Some(value.clone()),
                "consumer" => o.consumer = value.clone(),
                "delay_subject" => o.delay_subject = Some(value.clone()),
                "max_delayed" => {
                    o.max_delayed = value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("expected a positive integer"))?
                }
                "ack_wait" => o.ack_wait = duration()?,
                "max_ack_pending" => {
                    o.max_ack_pending = value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad("expected a positive integer"))?
                }
                "poll_window" => o.poll_window = duration()?,
                "request_timeout" => o.request_timeout = duration()?,
                "connect_timeout" => o.connect_timeout = duration()?,
                "max_backoff" => o.max_backoff = duration()?,
                "auto_setup" => o.auto_setup = boolean()?,
                "duplicate_window" => o.duplicate_window = duration()?,
                "storage" => o.storage = value.parse().map_err(|e: String| bad(&e))?,
                "replicas" => {
                    o.replicas = value
                        .parse::<u8>()
                        .ok()
                        .filter(|n| (1..=5).contains(n))
                        .ok_or_else(|| bad("expected 1 to 5"))?
                }
                "serializer" => o.serializer = value.parse().map_err(|e| bad(&format!("{e}")))?,
                "token" => o.token = Some(value.clone()),
                "concurrency_max" | "concurrency_key" | "fair" => {
                    return Err(format!(
                        "option `{key}`: a concurrency limit per key or fair claims need a slot store shared by every worker, which NATS JetStream does not have (a per-process limit would be wrong across hosts, so Courier refuses it): use a SQL or Redis transport (concurrency_max, concurrency_key, fair) for this queue"
                    ));
                }
                other => {
                    return Err(format!(
                        "unknown option `{other}` (known: {})",
                        KNOWN.join(", ")
                    ));
                }
            }
        }
        if let Some(subject) = subject {
            o.subject = subject;
        }
        o.validate()?;
        Ok(o)
    }
}

fn check_name(option: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("the {option} name must not be empty"));
    }
    if name.chars().count() > 255 {
        return Err(format!(
            "the {option} name `{name}` is longer than 255 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "the {option} name `{}` contains {}, which JetStream does not allow in names \
             (no whitespace, `.`, `*`, `>`, `/` or `\\`)",
            name.escape_debug(),
            describe(c)
        ));
    }
    Ok(())
}

fn check_subject(option: &str, subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err(format!("option `{option}` must not be empty"));
    }
    if let Some(c) = subject
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '*' | '>'))
    {
        return Err(format!(
            "the {option} `{}` contains {} (messages are published to it: no whitespace or \
             wildcards)",
            subject.escape_debug(),
            describe(c)
        ));
    }
    if subject.split('.').any(str::is_empty) {
        return Err(format!(
            "the {option} `{subject}` has an empty token (a leading, trailing or double `.`)"
        ));
    }
    Ok(())
}

fn describe(c: char) -> String {
    if c.is_whitespace() || c.is_control() {
        format!("the character {:?}", c)
    } else {
        format!("`{c}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(dsn: &str) -> Result<NatsOptions, String> {
        NatsOptions::from_dsn("async", &Dsn::parse(dsn).map_err(|e| e.to_string())?)
    }

    #[test]
    fn defaults_name_the_stream_after_the_transport_or_the_path() {
        let o = parse("nats://localhost:4222").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (o.stream.as_str(), o.subject.as_str(), o.consumer.as_str()),
            ("async", "async.messages", "courier")
        );
        assert_eq!(o.ack_wait, Duration::from_secs(30));
        assert_eq!(o.delay_subject_name(), "async.messages.delayed");
        assert_eq!(o.delay_consumer_name(), "courier-delayed");
        assert_eq!(o.max_delayed, 100_000);
        assert!(o.auto_setup);
        let o = parse("nats://localhost/orders").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (o.stream.as_str(), o.subject.as_str()),
            ("orders", "orders.messages")
        );
        let o = parse("nats://localhost?stream=orders").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (o.stream.as_str(), o.subject.as_str()),
            ("orders", "orders.messages")
        );
        let e = parse("nats://localhost/orders?stream=invoices")
            .err()
            .unwrap_or_default();
        assert!(e.contains("`orders`") && e.contains("`invoices`"), "{e}");
    }

    #[test]
    fn query_options_override_the_defaults() {
        let o = parse(
            "nats://localhost/orders?subject=app.orders&consumer=workers&ack_wait=5s\
             &max_ack_pending=64&poll_window=250ms&request_timeout=3s&connect_timeout=1s\
             &max_backoff=2s&auto_setup=false&duplicate_window=1min&storage=memory&replicas=3\
             &serializer=msgpack&delay_subject=app.later&max_delayed=7",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.subject, "app.orders");
        assert_eq!(o.delay_subject_name(), "app.later");
        assert_eq!(o.delay_consumer_name(), "workers-delayed");
        assert_eq!(o.max_delayed, 7);
        assert_eq!(o.consumer, "workers");
        assert_eq!(o.ack_wait, Duration::from_secs(5));
        assert_eq!(o.max_ack_pending, 64);
        assert_eq!(o.poll_window, Duration::from_millis(250));
        assert_eq!(o.request_timeout, Duration::from_secs(3));
        assert_eq!(o.connect_timeout, Duration::from_secs(1));
        assert_eq!(o.max_backoff, Duration::from_secs(2));
        assert!(!o.auto_setup);
        assert_eq!(o.duplicate_window, Duration::from_secs(60));
        assert_eq!(o.storage, StorageType::Memory);
        assert_eq!(o.replicas, 3);
        assert_eq!(o.serializer, courier_core::Serializer::MessagePack);
        let o =
            parse("nats://localhost/orders?subject=app.orders").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            o.delay_subject_name(),
            "app.orders.delayed",
            "the default delay subject follows the subject"
        );
    }

    #[test]
    fn a_concurrency_limit_is_refused_not_degraded_to_per_process() {
        for option in ["concurrency_max=3", "concurrency_key=$.tenant", "fair=true"] {
            let e = parse(&format!("nats://localhost:4222/jobs?{option}"))
                .err()
                .unwrap_or_default();
            assert!(
                e.contains("NATS JetStream does not have")
                    && e.contains("use a SQL or Redis transport"),
                "{e}"
            );
        }
    }

    #[test]
    fn unknown_options_and_bad_values_are_named() {
        let e = parse("nats://localhost?colour=red")
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown option `colour`"), "{e}");
        for (dsn, culprit) in [
            ("nats://localhost?ack_wait=soon", "`ack_wait`"),
            ("nats://localhost?ack_wait=0s", "`ack_wait`"),
            ("nats://localhost?max_ack_pending=0", "`max_ack_pending`"),
            ("nats://localhost?max_delayed=0", "`max_delayed`"),
            ("nats://localhost?max_delayed=lots", "`max_delayed`"),
            (
                "nats://localhost/a?delay_subject=a.messages",
                "`delay_subject`",
            ),
            ("nats://localhost?replicas=9", "`replicas`"),
            ("nats://localhost?storage=tape", "`storage`"),
            ("nats://localhost?auto_setup=maybe", "`auto_setup`"),
        ] {
            let e = parse(dsn).err().unwrap_or_default();
            assert!(e.contains(culprit), "{dsn}: {e}");
        }
    }

    #[test]
    fn names_jetstream_rejects_are_refused_naming_the_culprit() {
        for (dsn, culprit) in [
            ("nats://localhost/a.b", "`.`"),
            ("nats://localhost/a*", "`*`"),
            ("nats://localhost/a>", "`>`"),
            ("nats://localhost/ok?consumer=a%20b", "' '"),
            ("nats://localhost/ok?consumer=a%5Cb", "`\\`"),
            ("nats://localhost/ok?subject=a%20b", "' '"),
            ("nats://localhost/ok?consumer=c.d", "`.`"),
            ("nats://localhost/ok?subject=a.*", "`*`"),
            ("nats://localhost/ok?subject=a..b", "empty token"),
            ("nats://localhost/ok?subject=a.>", "`>`"),
            ("nats://localhost/ok?delay_subject=a.*", "delay_subject"),
            ("nats://localhost/ok?delay_subject=a..b", "delay_subject"),
        ] {
            let e = parse(dsn).err().unwrap_or_default();
            assert!(e.contains(culprit), "{dsn}: {e}");
        }
        let e = parse("nats://localhost/a/b").err().unwrap_or_default();
        assert!(e.contains("`/`"), "{e}");
        let e = NatsOptions::new("a\tb")
            .validate()
            .err()
            .unwrap_or_default();
        assert!(e.contains("'\\t'") && e.contains("stream"), "{e}");
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        let o = parse("nats://localhost?token=s3cr3t").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.token.as_deref(), Some("s3cr3t"));
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
}
