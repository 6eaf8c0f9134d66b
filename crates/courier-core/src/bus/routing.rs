//! Routing: which transports a message is sent to, by wire name.

use std::collections::HashMap;

/// Maps wire names to transport names: exact names, `prefix.*` wildcards (the longest prefix
/// wins) and `*` as the fallback. A message with no route is handled in-process.
///
/// ```
/// use courier_core::Router;
///
/// let router = Router::new()
///     .route("billing.*", ["async"])
///     .route("billing.refund", ["async", "audit"])
///     .route("*", ["default"]);
/// assert_eq!(router.resolve("billing.refund"), ["async", "audit"]);
/// assert_eq!(router.resolve("billing.invoice"), ["async"]);
/// assert_eq!(router.resolve("mail.welcome"), ["default"]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Router {
    exact: HashMap<String, Vec<String>>,
    /// (prefix without the `*`, transports), longest prefix first.
    prefixes: Vec<(String, Vec<String>)>,
    fallback: Vec<String>,
}

impl Router {
    /// No routes: every message is handled in-process.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes `pattern` (a wire name, `prefix.*` or `*`) to `transports`, replacing an earlier
    /// route for the same pattern.
    #[must_use]
    pub fn route<I, S>(mut self, pattern: &str, transports: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.add(pattern, transports.into_iter().map(Into::into).collect());
        self
    }

    /// Adds a route in place (see [`Router::route`]).
    pub fn add(&mut self, pattern: &str, transports: Vec<String>) {
        if pattern == "*" {
            self.fallback = transports;
        } else if let Some(prefix) = pattern.strip_suffix('*') {
            self.prefixes.retain(|(p, _)| p != prefix);
            self.prefixes.push((prefix.to_owned(), transports));
            self.prefixes
                .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        } else {
            self.exact.insert(pattern.to_owned(), transports);
        }
    }

    /// The transports for a wire name (empty: handle in-process).
    #[must_use]
    pub fn resolve(&self, name: &str) -> &[String] {
        if let Some(t) = self.exact.get(name) {
            return t;
        }
        self.prefixes
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
            .map_or(self.fallback.as_slice(), |(_, t)| t.as_slice())
    }

    /// Every transport name any route mentions.
    pub fn transport_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.exact
            .values()
            .chain(self.prefixes.iter().map(|(_, t)| t))
            .chain(std::iter::once(&self.fallback))
            .flatten()
            .map(String::as_str)
    }
}
