//! [`AmqpOptions`]: the options of Symfony's AMQP transport that Courier honours, read from a
//! DSN's query as PHP's `parse_str` reads them (`exchange[name]=...`,
//! `queues[messages][binding_keys][]=...`).

/// The queue arguments sent as integers: PHP's (`Connection::ARGUMENTS_AS_INTEGER`) and
/// `x-queue-version`, which RabbitMQ refuses as the string PHP 5.4 sends (PHP's declaration of
/// such a queue fails; Courier's succeeds).
const ARGUMENTS_AS_INTEGER: &[&str] = &[
    "x-delay",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-message-ttl",
    "x-queue-version",
];

/// PHP's connection options that change nothing on the wire Courier shares with PHP: accepted
/// and ignored (Courier's own connection settings apply).
const IGNORED: &[&str] = &[
    "retry",
    "persistent",
    "frame_max",
    "channel_max",
    "heartbeat",
    "read_timeout",
    "write_timeout",
    "confirm_timeout",
    "connect_timeout",
    "rpc_timeout",
];

/// A queue argument as PHP sends it: an integer for the `x-...` arguments PHP converts, a
/// string otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueArgument {
    /// Sent as a signed 64-bit integer (AMQP `l`), as PHP's ext-amqp sends a PHP int.
    Int(i64),
    /// Sent as a long string (AMQP `S`).
    Str(String),
}

/// One queue of the transport (`queues[<name>]`): bound to the exchange with its binding keys
/// (none: one binding with the empty key, as PHP binds with `null`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpQueue {
    /// The queue's name.
    pub name: String,
    /// `queues[<name>][binding_keys][]`.
    pub binding_keys: Vec<String>,
    /// `queues[<name>][arguments][<key>]`.
    pub arguments: Vec<(String, QueueArgument)>,
}

impl AmqpQueue {
    /// A queue with no binding key and no argument.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            binding_keys: Vec::new(),
            arguments: Vec::new(),
        }
    }
}

/// The options of Symfony's AMQP transport, with PHP's defaults: exchange `messages` (fanout,
/// durable), one queue named as the exchange bound to it, delay exchange `delays`, delay queues
/// named `delay_%exchange_name%_%routing_key%_%delay%`, auto setup on.
///
/// ```
/// use courier_symfony::AmqpOptions;
///
/// let options = AmqpOptions::from_query(
///     "emails",
///     &[("queues[emails_high][binding_keys][]".into(), "high".into())],
/// )?;
/// assert_eq!(options.exchange_name(), "emails");
/// assert_eq!(options.queues()[0].name, "emails_high");
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpOptions {
    pub(crate) exchange_name: String,
    pub(crate) exchange_type: String,
    pub(crate) default_publish_routing_key: Option<String>,
    pub(crate) queues: Vec<AmqpQueue>,
    pub(crate) delay_exchange_name: String,
    pub(crate) delay_queue_name_pattern: String,
    pub(crate) auto_setup: bool,
    pub(crate) prefetch_count: Option<u16>,
}

impl Default for AmqpOptions {
    fn default() -> Self {
        Self::new("messages")
    }
}

impl AmqpOptions {
    /// PHP's defaults for the exchange `exchange` (the DSN's second path segment): a queue of
    /// the same name.
    #[must_use]
    pub fn new(exchange: impl Into<String>) -> Self {
        let exchange = exchange.into();
        Self {
            queues: vec![AmqpQueue::new(exchange.clone())],
            exchange_name: exchange,
            exchange_type: "fanout".to_owned(),
            default_publish_routing_key: None,
            delay_exchange_name: "delays".to_owned(),
            delay_queue_name_pattern: "delay_%exchange_name%_%routing_key%_%delay%".to_owned(),
            auto_setup: true,
            prefetch_count: None,
        }
    }

    /// The options for the exchange of the DSN's path and the DSN's query pairs, with PHP's
    /// names. Unknown options are refused by name.
    ///
    /// # Errors
    /// The reason, naming the option.
    pub fn from_query(exchange: &str, query: &[(String, String)]) -> Result<Self, String> {
        let mut options = Self::new(exchange);
        let mut queues: Vec<AmqpQueue> = Vec::new();
        for (key, value) in query {
            let (head, path) = split_key(key)?;
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            match (head.as_str(), path.as_slice()) {
                ("exchange", ["name"]) => options.exchange_name = value.clone(),
                ("exchange", ["type"]) => match value.as_str() {
                    "fanout" | "direct" | "topic" | "headers" => {
                        options.exchange_type = value.clone();
                    }
                    _ => {
                        return Err(format!(
                            "invalid value `{value}` for option `exchange[type]` (fanout, direct, topic or headers)"
                        ));
                    }
                },
                ("exchange", ["default_publish_routing_key"]) => {
                    options.default_publish_routing_key = Some(value.clone());
                }
                ("delay", ["exchange_name"]) => options.delay_exchange_name = value.clone(),
                ("delay", ["queue_name_pattern"]) => {
                    options.delay_queue_name_pattern = value.clone();
                }
                ("auto_setup", []) => options.auto_setup = php_bool(value),
                ("prefetch_count", []) => {
                    options.prefetch_count = Some(
                        value
                            .trim()
                            .parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| {
                                format!(
                                    "invalid value `{value}` for option `prefetch_count` (1 to 65535)"
                                )
                            })?,
                    );
                }
                ("queues", [name, rest @ ..]) => {
                    let at = match queues.iter().position(|q| q.name == *name) {
                        Some(at) => at,
                        None => {
                            queues.push(AmqpQueue::new(*name));
                            queues.len() - 1
                        }
                    };
                    let queue = &mut queues[at];
                    match rest {
                        // `queues[name]` alone: a queue with no options.
                        [] => {}
                        ["binding_keys", _] => queue.binding_keys.push(value.clone()),
                        ["arguments", argument] => {
                            let argument = (*argument).to_owned();
                            let parsed = if ARGUMENTS_AS_INTEGER.contains(&argument.as_str()) {
                                QueueArgument::Int(value.trim().parse().map_err(|_| {
                                    format!(
                                        "Integer expected for queue argument `{argument}` of queue `{name}`, `{value}` given"
                                    )
                                })?)
                            } else {
                                QueueArgument::Str(value.clone())
                            };
                            queue.arguments.retain(|(k, _)| *k != argument);
                            queue.arguments.push((argument, parsed));
                        }
                        _ => return Err(unsupported(key)),
                    }
                }
                (name, []) if IGNORED.contains(&name) => {}
                _ => return Err(unsupported(key)),
            }
        }
        if !queues.is_empty() {
            options.queues = queues;
        } else if options.exchange_name != exchange {
            // PHP names the default queue after the DSN's exchange, not `exchange[name]`.
            options.queues = vec![AmqpQueue::new(exchange)];
        }
        if options.exchange_name.is_empty() {
            return Err("option `exchange[name]` must not be empty".to_owned());
        }
        if options.delay_exchange_name.is_empty() {
            return Err("option `delay[exchange_name]` must not be empty".to_owned());
        }
        Ok(options)
    }

    /// The exchange messages are published to (`exchange[name]`).
    #[must_use]
    pub fn exchange_name(&self) -> &str {
        &self.exchange_name
    }

    /// The queues messages are received from, in order (`queues[...]`).
    #[must_use]
    pub fn queues(&self) -> &[AmqpQueue] {
        &self.queues
    }

    /// The queues' names, in order.
    pub(crate) fn queue_names(&self) -> Vec<&str> {
        self.queues.iter().map(|q| q.name.as_str()).collect()
    }

    /// The delay exchange (`delay[exchange_name]`, default `delays`).
    #[must_use]
    pub fn delay_exchange_name(&self) -> &str {
        &self.delay_exchange_name
    }

    /// Sets the exchange's type (`exchange[type]`: fanout, direct, topic, headers).
    #[must_use]
    pub fn exchange_type(mut self, kind: impl Into<String>) -> Self {
        self.exchange_type = kind.into();
        self
    }

    /// Replaces the queues.
    #[must_use]
    pub fn queues_are(mut self, queues: Vec<AmqpQueue>) -> Self {
        self.queues = queues;
        self
    }

    /// Sets the delay exchange (`delay[exchange_name]`).
    #[must_use]
    pub fn delay_exchange(mut self, name: impl Into<String>) -> Self {
        self.delay_exchange_name = name.into();
        self
    }

    /// Sets the routing key of every message sent (`exchange[default_publish_routing_key]`).
    #[must_use]
    pub fn default_publish_routing_key(mut self, key: impl Into<String>) -> Self {
        self.default_publish_routing_key = Some(key.into());
        self
    }

    /// Whether the exchange, the queues and the delay exchange are declared when used
    /// (`auto_setup`, default on).
    #[must_use]
    pub fn auto_setup(mut self, on: bool) -> Self {
        self.auto_setup = on;
        self
    }

    /// Receives in consumer mode (`prefetch_count`): the broker pushes up to `prefetch`
    /// unacked messages to a `basic.consume` on each queue, rather than one `basic.get` per
    /// message as PHP's receiver asks (none, the default: `basic.get`, as PHP). Several times
    /// the throughput; a consumer holds what it was pushed until acked, or until no `get` has
    /// asked for 5 s, when it gives the messages back to the queue.
    #[must_use]
    pub fn prefetch_count(mut self, prefetch: Option<u16>) -> Self {
        self.prefetch_count = prefetch.filter(|n| *n > 0);
        self
    }

    /// The delay queue (and its routing key on the delay exchange) of a message delayed
    /// `delay_ms` with `routing_key`: PHP's `getRoutingKeyForDelay`, `_retry` or `_delay` at the
    /// end.
    pub(crate) fn delay_queue_name(&self, delay_ms: u64, routing_key: &str, retry: bool) -> String {
        let name = self
            .delay_queue_name_pattern
            .replace("%delay%", &delay_ms.to_string())
            .replace("%exchange_name%", &self.exchange_name)
            .replace("%routing_key%", routing_key);
        format!("{name}{}", if retry { "_retry" } else { "_delay" })
    }
}

fn unsupported(key: &str) -> String {
    format!(
        "unknown option `{key}` (known: exchange[name], exchange[type], exchange[default_publish_routing_key], \
         queues[<name>], queues[<name>][binding_keys][], queues[<name>][arguments][<key>], \
         delay[exchange_name], delay[queue_name_pattern], auto_setup, prefetch_count; ignored: {})",
        IGNORED.join(", ")
    )
}

/// PHP's `FILTER_VALIDATE_BOOLEAN` as Symfony applies it to `auto_setup` (anything else is
/// false).
fn php_bool(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "on" | "yes"
    )
}

/// `a[b][c][]` as PHP's `parse_str` splits it: `a` and `["b", "c", ""]`.
fn split_key(key: &str) -> Result<(String, Vec<String>), String> {
    let Some(open) = key.find('[') else {
        return Ok((key.to_owned(), Vec::new()));
    };
    let head = key[..open].to_owned();
    let mut rest = &key[open..];
    let mut path = Vec::new();
    while let Some(inner) = rest.strip_prefix('[') {
        let Some(close) = inner.find(']') else {
            return Err(format!("option `{key}`: unclosed `[`"));
        };
        path.push(inner[..close].to_owned());
        rest = &inner[close + 1..];
    }
    if !rest.is_empty() || head.is_empty() {
        return Err(format!("option `{key}` is not a PHP query key"));
    }
    Ok((head, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn php_defaults() {
        let o = AmqpOptions::from_query("messages", &[]).expect("defaults");
        assert_eq!(o, AmqpOptions::default());
        assert_eq!(o.queues, vec![AmqpQueue::new("messages")]);
        assert_eq!(
            o.delay_queue_name(1000, "", false),
            "delay_messages__1000_delay"
        );
        assert_eq!(
            o.delay_queue_name(2000, "messages", true),
            "delay_messages_messages_2000_retry"
        );
    }

    #[test]
    fn php_query_forms() {
        let o = AmqpOptions::from_query(
            "ex",
            &q(&[
                ("exchange[name]", "other"),
                ("exchange[type]", "direct"),
                ("queues[a][binding_keys][]", "k1"),
                ("queues[a][binding_keys][1]", "k2"),
                ("queues[a][arguments][x-max-priority]", "10"),
                ("queues[a][arguments][x-queue-mode]", "lazy"),
                ("queues[b]", ""),
                ("delay[exchange_name]", "d"),
                ("delay[queue_name_pattern]", "dq_%delay%"),
                ("auto_setup", "false"),
                ("heartbeat", "30"),
                ("prefetch_count", "64"),
            ]),
        )
        .expect("options");
        assert_eq!(o.exchange_name, "other");
        assert_eq!(o.exchange_type, "direct");
        assert_eq!(o.queues.len(), 2);
        assert_eq!(o.queues[0].binding_keys, vec!["k1", "k2"]);
        assert_eq!(
            o.queues[0].arguments,
            vec![
                ("x-max-priority".to_owned(), QueueArgument::Int(10)),
                ("x-queue-mode".to_owned(), QueueArgument::Str("lazy".into()))
            ]
        );
        assert_eq!(o.queues[1], AmqpQueue::new("b"));
        assert_eq!(o.delay_exchange_name, "d");
        assert_eq!(o.delay_queue_name(5, "", false), "dq_5_delay");
        assert!(!o.auto_setup);
        assert_eq!(o.prefetch_count, Some(64));
    }

    #[test]
    fn the_default_queue_keeps_the_dsns_exchange_name() {
        let o = AmqpOptions::from_query("ex", &q(&[("exchange[name]", "other")])).expect("o");
        assert_eq!(o.queues, vec![AmqpQueue::new("ex")]);
    }

    #[test]
    fn unknown_or_bad_options_are_named() {
        for (key, value, needle) in [
            ("queue", "x", "`queue`"),
            ("exchange[flags]", "2", "`exchange[flags]`"),
            ("queues[a][flags]", "2", "`queues[a][flags]`"),
            ("exchange[type]", "weird", "`exchange[type]`"),
            (
                "queues[a][arguments][x-message-ttl]",
                "soon",
                "x-message-ttl",
            ),
            ("delay[exchange_name", "x", "unclosed"),
            ("prefetch_count", "0", "`prefetch_count`"),
            ("prefetch_count", "many", "`prefetch_count`"),
            ("prefetch_count", "70000", "`prefetch_count`"),
        ] {
            let err = AmqpOptions::from_query("ex", &q(&[(key, value)])).expect_err(key);
            assert!(err.contains(needle), "{key}: {err}");
        }
    }
}
