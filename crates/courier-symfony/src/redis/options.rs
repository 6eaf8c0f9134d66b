//! [`RedisOptions`]: the options of Symfony's Redis transport that Courier honours, and their
//! reading from a `symfony+redis://` DSN.

use std::time::Duration;

use courier_core::Dsn;

/// The options of Symfony Messenger 5.4's Redis transport, with its defaults: stream
/// `messages`, group `symfony`, consumer `consumer`, delayed messages in `<stream>__queue`,
/// entries kept after an ack and deleted after a reject, pending entries of others claimed after
/// an hour (checked every minute), the `message` field written with phpredis's PHP serializer.
///
/// Give every worker, PHP's and Courier's, its own consumer name (as PHP's documentation asks):
/// a consumer re-reads its own pending entries when it starts.
///
/// ```
/// use std::time::Duration;
/// use courier_symfony::RedisOptions;
///
/// let options = RedisOptions::default()
///     .stream("emails")
///     .consumer("rust-1")
///     .redeliver_timeout(Duration::from_secs(600))
///     .php_serializer(false);
/// assert_eq!(options.queue_key(), "emails__queue");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) stream: String,
    pub(crate) group: String,
    pub(crate) consumer: String,
    pub(crate) auto_setup: bool,
    pub(crate) delete_after_ack: bool,
    pub(crate) delete_after_reject: bool,
    pub(crate) stream_max_entries: u64,
    pub(crate) dbindex: i64,
    pub(crate) redeliver_timeout: Duration,
    pub(crate) claim_interval: Duration,
    pub(crate) php_serializer: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            stream: "messages".to_owned(),
            group: "symfony".to_owned(),
            consumer: "consumer".to_owned(),
            auto_setup: true,
            delete_after_ack: false,
            delete_after_reject: true,
            stream_max_entries: 0,
            dbindex: 0,
            redeliver_timeout: Duration::from_secs(3600),
            claim_interval: Duration::from_millis(60_000),
            php_serializer: true,
        }
    }
}

impl RedisOptions {
    /// The stream (`stream`, default `messages`); delayed messages wait in `<stream>__queue`.
    #[must_use]
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = stream.into();
        self
    }

    /// The consumer group (`group`, default `symfony`).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// This worker's consumer name in the group (`consumer`, default `consumer`).
    #[must_use]
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = consumer.into();
        self
    }

    /// Whether the group (and the stream) is created when missing (`auto_setup`, default on).
    #[must_use]
    pub fn auto_setup(mut self, on: bool) -> Self {
        self.auto_setup = on;
        self
    }

    /// Whether an ack also deletes the entry (`delete_after_ack`, default off in Symfony 5.4).
    #[must_use]
    pub fn delete_after_ack(mut self, on: bool) -> Self {
        self.delete_after_ack = on;
        self
    }

    /// Whether a reject (and the old delivery of a retried message) deletes the entry
    /// (`delete_after_reject`, default on).
    #[must_use]
    pub fn delete_after_reject(mut self, on: bool) -> Self {
        self.delete_after_reject = on;
        self
    }

    /// The approximate most entries the stream keeps (`stream_max_entries`, `XADD MAXLEN ~`;
    /// 0, the default, keeps all).
    #[must_use]
    pub fn stream_max_entries(mut self, n: u64) -> Self {
        self.stream_max_entries = n;
        self
    }

    /// The Redis database (`dbindex`, default 0).
    #[must_use]
    pub fn dbindex(mut self, db: i64) -> Self {
        self.dbindex = db;
        self
    }

    /// How long an entry another consumer holds stays pending before this one claims it
    /// (`redeliver_timeout`, default an hour). Use PHP's value: Courier keeps what it holds from
    /// going idle that long.
    #[must_use]
    pub fn redeliver_timeout(mut self, timeout: Duration) -> Self {
        self.redeliver_timeout = timeout;
        self
    }

    /// How often pending entries are checked for ones to claim (`claim_interval`, default a
    /// minute).
    #[must_use]
    pub fn claim_interval(mut self, interval: Duration) -> Self {
        self.claim_interval = interval;
        self
    }

    /// Whether the `message` field is written with phpredis's PHP serializer (`serializer=1`,
    /// the default) or as plain JSON (`serializer=0`). Both are read either way.
    #[must_use]
    pub fn php_serializer(mut self, on: bool) -> Self {
        self.php_serializer = on;
        self
    }

    /// The stream's key.
    #[must_use]
    pub fn stream_key(&self) -> &str {
        &self.stream
    }

    /// The group.
    #[must_use]
    pub fn group_name(&self) -> &str {
        &self.group
    }

    /// The consumer name.
    #[must_use]
    pub fn consumer_name(&self) -> &str {
        &self.consumer
    }

    /// The sorted set of delayed messages: `<stream>__queue`.
    #[must_use]
    pub fn queue_key(&self) -> String {
        format!("{}__queue", self.stream)
    }
}

/// The options a `symfony+redis://` DSN takes in its query, as Symfony's Redis transport names
/// them.
pub(crate) const OPTIONS: &[&str] = &[
    "stream",
    "group",
    "consumer",
    "auto_setup",
    "delete_after_ack",
    "delete_after_reject",
    "stream_max_entries",
    "dbindex",
    "redeliver_timeout",
    "claim_interval",
    "serializer",
    "lazy",
    "tls",
];

/// Where to connect, read from the DSN (the password stays in the DSN until the connection).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Server {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// PHP's `FILTER_VALIDATE_BOOLEAN`, refusing what it would read as `false` by mistake.
fn boolean(key: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" | "" => Ok(false),
        _ => Err(format!(
            "invalid value `{value}` for option `{key}` (true or false)"
        )),
    }
}

fn integer<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("invalid value `{value}` for option `{key}` (a whole number)"))
}

/// Symfony's Redis options and the server from a `symfony+redis://host:port/stream/group/consumer?...`
/// DSN: the path's parts win over the `stream`, `group` and `consumer` options, as in PHP.
pub(crate) fn from_dsn(dsn: &Dsn) -> Result<(RedisOptions, Server), String> {
    dsn.check_options(OPTIONS).map_err(|e| e.reason)?;
    let mut o = RedisOptions::default();
    let named = |key: &str, default: &mut String| {
        if let Some(v) = dsn.option(key) {
            v.clone_into(default);
        }
    };
    named("stream", &mut o.stream);
    named("group", &mut o.group);
    named("consumer", &mut o.consumer);
    let path = dsn.path().trim_end_matches('/');
    let mut parts = path.split('/').skip(1);
    for slot in [&mut o.stream, &mut o.group, &mut o.consumer] {
        if let Some(part) = parts.next() {
            part.clone_into(slot);
        }
    }
    for (key, value) in [
        ("stream", &o.stream),
        ("group", &o.group),
        ("consumer", &o.consumer),
    ] {
        if value.is_empty() {
            return Err(format!("`{key}` should be configured, got an empty string"));
        }
    }
    for (key, slot) in [
        ("auto_setup", &mut o.auto_setup),
        ("delete_after_ack", &mut o.delete_after_ack),
        ("delete_after_reject", &mut o.delete_after_reject),
    ] {
        if let Some(v) = dsn.option(key) {
            *slot = boolean(key, v)?;
        }
    }
    if let Some(v) = dsn.option("lazy") {
        boolean("lazy", v)?;
    }
    if let Some(v) = dsn.option("tls")
        && boolean("tls", v)?
    {
        return Err(
            "option `tls`: TLS is not supported by Courier's Symfony Redis transport".into(),
        );
    }
    if let Some(v) = dsn.option("stream_max_entries") {
        o.stream_max_entries = integer("stream_max_entries", v)?;
    }
    if let Some(v) = dsn.option("dbindex") {
        o.dbindex = integer("dbindex", v)?;
    }
    if let Some(v) = dsn.option("redeliver_timeout") {
        o.redeliver_timeout = match v.parse::<u64>() {
            Ok(seconds) => Duration::from_secs(seconds),
            Err(_) => humantime::parse_duration(v)
                .map_err(|e| format!("invalid value `{v}` for option `redeliver_timeout`: {e}"))?,
        };
    }
    if let Some(v) = dsn.option("claim_interval") {
        o.claim_interval = match v.parse::<u64>() {
            Ok(ms) => Duration::from_millis(ms),
            Err(_) => humantime::parse_duration(v)
                .map_err(|e| format!("invalid value `{v}` for option `claim_interval`: {e}"))?,
        };
    }
    if let Some(v) = dsn.option("serializer") {
        o.php_serializer = match v {
            "1" => true,
            "0" => false,
            _ => {
                return Err(format!(
                    "invalid value `{v}` for option `serializer` (1: phpredis's PHP serializer, 0: none; \
                     igbinary, msgpack and json are not supported)"
                ));
            }
        };
    }
    let host = dsn.host().filter(|h| !h.is_empty()).ok_or_else(|| {
        "a host is needed: symfony+redis://host:port/stream/group/consumer (Unix sockets and \
         clusters are not supported)"
            .to_owned()
    })?;
    let server = Server {
        host: host.to_owned(),
        port: dsn.port().unwrap_or(6379),
        user: dsn.user().filter(|u| !u.is_empty()).map(str::to_owned),
        password: dsn.password().filter(|p| !p.is_empty()).map(str::to_owned),
    };
    Ok((o, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<(RedisOptions, Server), String> {
        from_dsn(&Dsn::parse(raw).expect("dsn"))
    }

    #[test]
    fn the_path_names_stream_group_and_consumer_as_in_php() {
        let (o, s) = parse("symfony+redis://u:pw@h:6380/s1/g1/c1?group=ignored").expect("dsn");
        assert_eq!((o.stream.as_str(), o.group.as_str()), ("s1", "g1"));
        assert_eq!(o.consumer, "c1");
        assert_eq!((s.host.as_str(), s.port), ("h", 6380));
        assert_eq!(s.password.as_deref(), Some("pw"));
        assert!(!format!("{s:?}").contains("pw"));
        let (o, _) = parse("symfony+redis://h/s2?consumer=c2").expect("dsn");
        assert_eq!(
            o,
            RedisOptions::default().stream("s2").consumer("c2"),
            "the rest keeps PHP's defaults"
        );
        let (o, s) = parse("symfony+redis://h").expect("dsn");
        assert_eq!((o, s.port), (RedisOptions::default(), 6379));
        let (o, _) = parse("symfony+redis://h/s/").expect("dsn");
        assert_eq!(o.stream, "s", "a trailing slash is dropped, as PHP does");
    }

    #[test]
    fn options_have_symfonys_names_and_units() {
        let (o, _) = parse(
            "symfony+redis://h/s?serializer=0&delete_after_ack=true&delete_after_reject=false&stream_max_entries=10&dbindex=2&redeliver_timeout=5&claim_interval=250&auto_setup=off&lazy=1",
        )
        .expect("dsn");
        assert_eq!(
            o,
            RedisOptions::default()
                .stream("s")
                .php_serializer(false)
                .delete_after_ack(true)
                .delete_after_reject(false)
                .stream_max_entries(10)
                .dbindex(2)
                .redeliver_timeout(Duration::from_secs(5))
                .claim_interval(Duration::from_millis(250))
                .auto_setup(false)
        );
    }

    #[test]
    fn bad_options_are_named() {
        for (dsn, named) in [
            ("symfony+redis://h/s?queue=x", "`queue`"),
            ("symfony+redis://h/s?serializer=2", "`serializer`"),
            (
                "symfony+redis://h/s?delete_after_ack=maybe",
                "`delete_after_ack`",
            ),
            ("symfony+redis://h/s?dbindex=x", "`dbindex`"),
            ("symfony+redis://h/s?tls=1", "`tls`"),
            ("symfony+redis://h/s//c", "`group`"),
            ("symfony+redis:///var/run/redis.sock", "host"),
        ] {
            let err = parse(dsn).expect_err(dsn);
            assert!(err.contains(named), "{dsn}: {err}");
        }
    }
}
