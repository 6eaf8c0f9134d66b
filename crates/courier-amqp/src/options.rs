//! [`AmqpOptions`]: exchange, queues, prefetch and timings, built in code or read from a DSN.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use courier_core::Dsn;

/// The type of the exchange messages are published to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExchangeType {
    /// Every bound queue gets every message (the default, as in Symfony).
    #[default]
    Fanout,
    /// Queues bound with the exact routing key.
    Direct,
    /// Queues bound with a matching pattern (`*`, `#`).
    Topic,
}

impl ExchangeType {
    pub(crate) fn kind(self) -> lapin::ExchangeKind {
        match self {
            Self::Fanout => lapin::ExchangeKind::Fanout,
            Self::Direct => lapin::ExchangeKind::Direct,
            Self::Topic => lapin::ExchangeKind::Topic,
        }
    }
}

impl FromStr for ExchangeType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fanout" => Ok(Self::Fanout),
            "direct" => Ok(Self::Direct),
            "topic" => Ok(Self::Topic),
            other => Err(format!(
                "unknown exchange type `{other}` (expected fanout, direct or topic)"
            )),
        }
    }
}

/// A queue argument value (`x-max-priority=10`, `x-queue-type=quorum`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgumentValue {
    /// An integer (sent as a signed 64-bit AMQP integer).
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

impl ArgumentValue {
    /// Parses a DSN value: integers and `true`/`false` are typed, anything else is a string.
    #[must_use]
    pub fn parse(s: &str) -> Self {
        if let Ok(i) = s.parse::<i64>() {
            Self::Int(i)
        } else if let Ok(b) = s.parse::<bool>() {
            Self::Bool(b)
        } else {
            Self::Str(s.to_owned())
        }
    }

    pub(crate) fn to_amqp(&self) -> lapin::types::AMQPValue {
        use lapin::types::{AMQPValue, LongString};
        match self {
            Self::Int(i) => AMQPValue::LongLongInt(*i),
            Self::Bool(b) => AMQPValue::Boolean(*b),
            Self::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        }
    }
}

impl fmt::Display for ArgumentValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Str(s) => f.write_str(s),
        }
    }
}

/// One queue of the transport: its name, the keys it is bound to the exchange with, and its
/// declaration arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueOptions {
    pub(crate) name: String,
    pub(crate) binding_keys: Vec<String>,
    pub(crate) arguments: BTreeMap<String, ArgumentValue>,
}

impl QueueOptions {
    /// A durable classic queue bound with the transport's routing key.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            binding_keys: Vec::new(),
            arguments: BTreeMap::new(),
        }
    }

    /// Adds a binding key (several are allowed; none means the transport's `routing_key`).
    #[must_use]
    pub fn binding_key(mut self, key: impl Into<String>) -> Self {
        self.binding_keys.push(key.into());
        self
    }

    /// Sets a declaration argument, e.g. `("x-max-priority", ArgumentValue::Int(10))`.
    #[must_use]
    pub fn argument(mut self, key: impl Into<String>, value: ArgumentValue) -> Self {
        self.arguments.insert(key.into(), value);
        self
    }

    /// Makes it a quorum queue (`x-queue-type=quorum`).
    #[must_use]
    pub fn quorum(self) -> Self {
        self.argument("x-queue-type", ArgumentValue::Str("quorum".into()))
    }

    /// Enables priorities 0..=`max` (`x-max-priority`; classic queues only).
    #[must_use]
    pub fn max_priority(self, max: u8) -> Self {
        self.argument("x-max-priority", ArgumentValue::Int(i64::from(max)))
    }

    /// The queue's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn has_priority(&self) -> bool {
        self.arguments.contains_key("x-max-priority")
    }
}

/// Options of an [`AmqpTransport`](crate::AmqpTransport).
///
/// DSN form (every option optional):
///
/// ```text
/// amqp://user:pass@host:5672/vhost?exchange=orders&exchange_type=direct
///     &queues[orders_high]=high&queues[orders_low]=low,bulk
///     &queue_arguments[orders_high][x-max-priority]=10
///     &queue_arguments[orders_low][x-queue-type]=quorum
///     &routing_key=high&prefetch=64&persistent=true&confirm_timeout=10s
///     &auto_setup=true&poll_window=1s&connect_timeout=5s&max_backoff=5s&serializer=json
/// ```
///
/// `queues[NAME]=k1,k2` declares queue `NAME` bound with keys `k1` and `k2` (empty: bound with
/// `routing_key`); `queues=a,b` is the short form without keys. Without any queue, one queue named
/// like the transport is used. The exchange defaults to the transport's name, type `fanout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpOptions {
    pub(crate) exchange: String,
    pub(crate) exchange_type: ExchangeType,
    pub(crate) queues: Vec<QueueOptions>,
    pub(crate) routing_key: String,
    pub(crate) prefetch: u16,
    pub(crate) persistent: bool,
    pub(crate) confirm_timeout: Duration,
    pub(crate) auto_setup: bool,
    pub(crate) poll_window: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) serializer: courier_core::Serializer,
}

const KNOWN: &[&str] = &[
    "exchange",
    "exchange_type",
    "queues",
    "queues[NAME]",
    "queue_arguments[NAME][ARG]",
    "routing_key",
    "prefetch",
    "persistent",
    "confirm_timeout",
    "auto_setup",
    "poll_window",
    "connect_timeout",
    "max_backoff",
    "serializer",
];

impl AmqpOptions {
    /// Defaults for a transport named `name`: exchange `name` (fanout), one queue `name`,
    /// prefetch 64, persistent messages, confirm timeout 10 s, auto setup, poll window 1 s,
    /// connect timeout 5 s, reconnect backoff capped at 5 s.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            exchange: name.clone(),
            exchange_type: ExchangeType::Fanout,
            queues: vec![QueueOptions::new(name)],
            routing_key: String::new(),
            prefetch: 64,
            persistent: true,
            confirm_timeout: Duration::from_secs(10),
            auto_setup: true,
            poll_window: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            serializer: courier_core::Serializer::Json,
        }
    }

    /// Sets the exchange name and type.
    #[must_use]
    pub fn exchange(mut self, name: impl Into<String>, kind: ExchangeType) -> Self {
        self.exchange = name.into();
        self.exchange_type = kind;
        self
    }

    /// Replaces the queues.
    #[must_use]
    pub fn queues(mut self, queues: impl IntoIterator<Item = QueueOptions>) -> Self {
        self.queues = queues.into_iter().collect();
        self
    }

    /// The routing key messages are published with (default empty).
    #[must_use]
    pub fn routing_key(mut self, key: impl Into<String>) -> Self {
        self.routing_key = key.into();
        self
    }

    /// How many unacked deliveries the broker pushes ahead (`basic.qos`, default 64).
    #[must_use]
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// Whether messages are persistent (delivery mode 2, default true).
    #[must_use]
    pub fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    /// How long `send` waits for the broker's publisher confirm (default 10 s).
    #[must_use]
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Whether the topology is declared on connect (default true).
    #[must_use]
    pub fn auto_setup(mut self, auto_setup: bool) -> Self {
        self.auto_setup = auto_setup;
        self
    }

    /// How long `get` waits for a first message (default 1 s).
    #[must_use]
    pub fn poll_window(mut self, window: Duration) -> Self {
        self.poll_window = window;
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

    /// Sets the body serializer (`json` by default, or `msgpack`: see
    /// [`Serializer`](courier_core::Serializer)); consumers decode by each message's content type.
    #[must_use]
    pub fn serializer(mut self, serializer: courier_core::Serializer) -> Self {
        self.serializer = serializer;
        self
    }

    /// The exchange's name.
    #[must_use]
    pub fn exchange_name(&self) -> &str {
        &self.exchange
    }

    /// The queues.
    #[must_use]
    pub fn queue_options(&self) -> &[QueueOptions] {
        &self.queues
    }

    /// The queues' names, in order.
    pub(crate) fn queue_names(&self) -> Vec<&str> {
        self.queues.iter().map(|q| q.name.as_str()).collect()
    }

    /// Reads the options of the transport `name` from a DSN's query (see the type docs).
    ///
    /// # Errors
    /// A message naming the unknown option or the bad value.
    pub fn from_dsn(name: &str, dsn: &Dsn) -> Result<Self, String> {
        let mut o = Self::new(name);
        let mut queues: Vec<QueueOptions> = Vec::new();
        let mut arguments: Vec<(String, String, String)> = Vec::new();
        let queue_entry = |queues: &mut Vec<QueueOptions>, q: &str| -> usize {
            match queues.iter().position(|x| x.name == q) {
                Some(i) => i,
                None => {
                    queues.push(QueueOptions::new(q));
                    queues.len() - 1
                }
            }
        };
        for (key, value) in dsn.options() {
            let bad = |what: &str| format!("invalid value `{value}` for option `{key}`: {what}");
            match key.as_str() {
                "exchange" => o.exchange = value.clone(),
                "exchange_type" => o.exchange_type = value.parse()?,
                "queues" => {
                    for q in value.split(',').map(str::trim).filter(|q| !q.is_empty()) {
                        queue_entry(&mut queues, q);
                    }
                }
                "routing_key" => o.routing_key = value.clone(),
                "prefetch" => {
                    o.prefetch = value
                        .parse::<u16>()
                        .map_err(|_| bad("expected 1..=65535"))?
                        .max(1)
                }
                "persistent" => {
                    o.persistent = value.parse().map_err(|_| bad("expected true or false"))?
                }
                "auto_setup" => {
                    o.auto_setup = value.parse().map_err(|_| bad("expected true or false"))?
                }
                "confirm_timeout" => {
                    o.confirm_timeout = parse_duration(value).map_err(|e| bad(&e))?
                }
                "poll_window" => o.poll_window = parse_duration(value).map_err(|e| bad(&e))?,
                "connect_timeout" => {
                    o.connect_timeout = parse_duration(value).map_err(|e| bad(&e))?
                }
                "max_backoff" => o.max_backoff = parse_duration(value).map_err(|e| bad(&e))?,
                "serializer" => o.serializer = value.parse().map_err(|e| bad(&format!("{e}")))?,
                "concurrency_max" | "concurrency_key" | "fair" => {
                    return Err(format!(
                        "option `{key}`: a concurrency limit per key or fair claims need a slot store shared by every worker, which RabbitMQ does not have (a per-process limit would be wrong across hosts, so Courier refuses it): use a SQL or Redis transport (concurrency_max, concurrency_key, fair) for this queue"
                    ));
                }
                other => {
                    if let Some(q) = bracket(other, "queues") {
                        let i = queue_entry(&mut queues, q);
                        queues[i].binding_keys.extend(
                            value
                                .split(',')
                                .map(str::trim)
                                .filter(|k| !k.is_empty())
                                .map(str::to_owned),
                        );
                    } else if let Some((q, arg)) = bracket2(other, "queue_arguments") {
                        arguments.push((q.to_owned(), arg.to_owned(), value.clone()));
                    } else {
                        return Err(format!(
                            "unknown option `{other}` (known: {})",
                            KNOWN.join(", ")
                        ));
                    }
                }
            }
        }
        if !queues.is_empty() {
            o.queues = queues;
        }
        for (q, arg, value) in arguments {
            let Some(queue) = o.queues.iter_mut().find(|x| x.name == q) else {
                return Err(format!(
                    "`queue_arguments[{q}]` names no queue of this transport"
                ));
            };
            queue.arguments.insert(arg, ArgumentValue::parse(&value));
        }
        if o.exchange.is_empty() {
            return Err("option `exchange` must not be empty".into());
        }
        Ok(o)
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn bracket<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    key.strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')
        .filter(|s| !s.is_empty() && !s.contains(']'))
}

fn bracket2<'a>(key: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let inner = key
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    let (a, b) = inner.split_once("][")?;
    (!a.is_empty() && !b.is_empty()).then_some((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(dsn: &str) -> Result<AmqpOptions, String> {
        AmqpOptions::from_dsn("async", &Dsn::parse(dsn).map_err(|e| e.to_string())?)
    }

    #[test]
    fn defaults_name_exchange_and_queue_after_the_transport() {
        let o = parse("amqp://localhost").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.exchange, "async");
        assert_eq!(o.exchange_type, ExchangeType::Fanout);
        assert_eq!(o.queues, vec![QueueOptions::new("async")]);
        assert_eq!((o.prefetch, o.persistent, o.auto_setup), (64, true, true));
    }

    #[test]
    fn queues_keys_and_arguments_parse_from_brackets() {
        let o = parse(
            "amqp://localhost?exchange=ex&exchange_type=topic&queues[a]=k1,k2&queues[b]=\
             &queue_arguments[a][x-max-priority]=10&queue_arguments[b][x-queue-type]=quorum&prefetch=1\
             &confirm_timeout=250ms",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.exchange_type, ExchangeType::Topic);
        assert_eq!(
            o.queues[0],
            QueueOptions::new("a")
                .binding_key("k1")
                .binding_key("k2")
                .max_priority(10)
        );
        assert_eq!(o.queues[1], QueueOptions::new("b").quorum());
        assert_eq!(o.prefetch, 1);
        assert_eq!(o.confirm_timeout, Duration::from_millis(250));
    }

    #[test]
    fn a_concurrency_limit_is_refused_not_degraded_to_per_process() {
        for option in ["concurrency_max=3", "concurrency_key=$.tenant", "fair=true"] {
            let dsn = Dsn::parse(&format!("amqp://localhost/%2f/jobs?{option}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let e = AmqpOptions::from_dsn("jobs", &dsn)
                .err()
                .unwrap_or_default();
            assert!(
                e.contains("RabbitMQ does not have") && e.contains("use a SQL or Redis transport"),
                "{e}"
            );
        }
    }

    #[test]
    fn unknown_options_and_bad_values_are_named() {
        let e = parse("amqp://localhost?colour=red")
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown option `colour`"), "{e}");
        let e = parse("amqp://localhost?prefetch=lots")
            .err()
            .unwrap_or_default();
        assert!(e.contains("`prefetch`"), "{e}");
        let e = parse("amqp://localhost?queue_arguments[nope][x]=1")
            .err()
            .unwrap_or_default();
        assert!(e.contains("names no queue"), "{e}");
    }
}
