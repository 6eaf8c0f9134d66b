//! DSNs: `scheme://user:password@host:port/path?option=value`, with the password redacted in
//! every `Debug` and `Display`.

use std::fmt;

/// A parsed data source name.
///
/// ```
/// use courier_core::Dsn;
///
/// let dsn: Dsn = "postgres://app:s3cret@db:5432/app?queue_name=emails".parse()?;
/// assert_eq!(dsn.scheme(), "postgres");
/// assert_eq!(dsn.option("queue_name"), Some("emails"));
/// assert_eq!(dsn.to_string(), "postgres://app:***@db:5432/app?queue_name=emails");
/// assert!(!format!("{dsn:?}").contains("s3cret"));
/// # Ok::<(), courier_core::DsnError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Dsn {
    raw: String,
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    host: Option<String>,
    port: Option<u16>,
    path: String,
    options: Vec<(String, String)>,
}

/// A DSN did not parse. Displays the DSN redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid DSN `{dsn}`: {reason}")]
pub struct DsnError {
    /// The DSN, password redacted.
    pub dsn: String,
    /// What is wrong.
    pub reason: String,
}

impl DsnError {
    /// An error about `raw` (redacted here) for `reason`.
    #[must_use]
    pub fn new(raw: &str, reason: impl Into<String>) -> Self {
        Self {
            dsn: redact(raw),
            reason: reason.into(),
        }
    }
}

/// Redacts the password of anything that looks like a DSN (best effort, for error messages).
#[must_use]
pub fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let rest = &raw[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut out = raw.to_owned();
    if let Some(at) = authority.rfind('@') {
        let userinfo = &authority[..at];
        if let Some(colon) = userinfo.find(':') {
            let start = scheme_end + 3 + colon + 1;
            out.replace_range(start..scheme_end + 3 + at, "***");
        }
    }
    redact_query_secrets(&out)
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "pass", "secret", "token"]
        .iter()
        .any(|s| key.contains(s))
}

fn redact_query_secrets(s: &str) -> String {
    let Some(q) = s.find('?') else {
        return s.to_owned();
    };
    let (head, query) = s.split_at(q + 1);
    let parts: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if is_secret_key(k) => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{head}{}", parts.join("&"))
}

fn percent_decode(raw: &str, s: &str) -> Result<String, DsnError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .ok_or_else(|| DsnError::new(raw, "truncated percent-escape"))?;
                let b = u8::from_str_radix(hex, 16)
                    .map_err(|_| DsnError::new(raw, "invalid percent-escape"))?;
                out.push(b);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| DsnError::new(raw, "percent-escape is not UTF-8"))
}

impl std::str::FromStr for Dsn {
    type Err = DsnError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let raw = raw.trim();
        let (scheme, rest) = raw.split_once(':').ok_or_else(|| {
            DsnError::new(raw, "missing scheme (expected e.g. `sqlite://courier.db`)")
        })?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return Err(DsnError::new(raw, "invalid scheme"));
        }
        let rest = rest.split_once('#').map_or(rest, |(a, _)| a);
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (mut user, mut password, mut host, mut port, path);
        (user, password, host, port) = (None, None, None, None);
        if let Some(after) = before_query.strip_prefix("//") {
            let authority_end = after.find('/').unwrap_or(after.len());
            let authority = &after[..authority_end];
            path = after[authority_end..].to_owned();
            let host_port = match authority.rfind('@') {
                Some(at) => {
                    let userinfo = &authority[..at];
                    match userinfo.split_once(':') {
                        Some((u, p)) => {
                            user = Some(percent_decode(raw, u)?);
                            password = Some(percent_decode(raw, p)?);
                        }
                        None => user = Some(percent_decode(raw, userinfo)?),
                    }
                    &authority[at + 1..]
                }
                None => authority,
            };
            let (h, p) = match host_port.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || host_port.starts_with('[') => {
                    if p.is_empty() {
                        (h, None)
                    } else {
                        let p: u16 = p
                            .parse()
                            .map_err(|_| DsnError::new(raw, format!("invalid port `{p}`")))?;
                        (h, Some(p))
                    }
                }
                _ => (host_port, None),
            };
            if !h.is_empty() {
                host = Some(percent_decode(raw, h)?);
            }
            port = p;
        } else {
            path = before_query.to_owned();
        }
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            options.push((percent_decode(raw, k)?, percent_decode(raw, v)?));
        }
        Ok(Self {
            raw: raw.to_owned(),
            scheme: scheme.to_ascii_lowercase(),
            user,
            password,
            host,
            port,
            path,
            options,
        })
    }
}

impl Dsn {
    /// Parses a DSN (same as `str::parse`).
    ///
    /// # Errors
    /// [`DsnError`] naming the problem, with the DSN redacted.
    pub fn parse(raw: &str) -> Result<Self, DsnError> {
        raw.parse()
    }

    /// The scheme, lowercased (`postgres`, `sqlite`, `redis`, ...).
    #[must_use]
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name.
    #[must_use]
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password. Never log it.
    #[must_use]
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The host.
    #[must_use]
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The port.
    #[must_use]
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The path after the authority (`/app` in `postgres://db/app`), or after the scheme when
    /// there is no `//`.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value of a query option (the last one when repeated).
    #[must_use]
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// All query options in order.
    #[must_use]
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// Sets (replaces) an option.
    #[must_use]
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        let key = key.into();
        self.options.retain(|(k, _)| *k != key);
        self.options.push((key, value.into()));
        self
    }

    /// The DSN as written, password included: only for handing to a driver. Never log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The DSN as written without its query string (the form drivers take when Courier consumes
    /// the options itself). Contains the password: never log it.
    #[must_use]
    pub fn expose_without_query(&self) -> &str {
        self.raw.split_once('?').map_or(&self.raw, |(a, _)| a)
    }

    /// Rejects options not in `known`, naming the first unknown one.
    ///
    /// # Errors
    /// [`DsnError`] naming the option and listing the known ones.
    pub fn check_options(&self, known: &[&str]) -> Result<(), DsnError> {
        match self
            .options
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(DsnError::new(
                &self.raw,
                format!("unknown option `{k}` (known: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// Parses an option with `FromStr`, naming the option on failure.
    ///
    /// # Errors
    /// [`DsnError`] naming the option and its bad value.
    pub fn parse_option<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, DsnError> {
        self.option(key)
            .map(|v| {
                v.parse::<T>().map_err(|_| {
                    DsnError::new(&self.raw, format!("invalid value `{v}` for option `{key}`"))
                })
            })
            .transpose()
    }

    /// Parses a duration option written as humantime (`250ms`, `30s`, `1h`).
    ///
    /// # Errors
    /// [`DsnError`] naming the option and its bad value.
    pub fn duration_option(&self, key: &str) -> Result<Option<std::time::Duration>, DsnError> {
        self.option(key)
            .map(|v| {
                humantime::parse_duration(v).map_err(|e| {
                    DsnError::new(
                        &self.raw,
                        format!("invalid duration `{v}` for option `{key}`: {e}"),
                    )
                })
            })
            .transpose()
    }
}

impl fmt::Display for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.raw))
    }
}

impl fmt::Debug for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Dsn").field(&redact(&self.raw)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dsn(s: &str) -> Dsn {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_password_never_shows_in_debug_or_display() {
        let d = dsn("postgres://app:hunter2@db:5432/app?sslmode=disable");
        assert_eq!(d.password(), Some("hunter2"));
        for shown in [format!("{d}"), format!("{d:?}"), format!("{d:#?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("app:***@db:5432"), "{shown}");
        }
    }

    #[test]
    fn secret_query_options_are_redacted_too() {
        let d = dsn("redis://localhost?password=hunter2&stream=s");
        assert_eq!(d.to_string(), "redis://localhost?password=***&stream=s");
    }

    #[test]
    fn an_invalid_dsn_error_is_redacted() {
        let err = Dsn::parse("postgres://app:hunter2@db:notaport/app")
            .err()
            .map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.contains("invalid port `notaport`"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn parts_and_options_parse() {
        let d = dsn("mysql://root@127.0.0.1:3306/test?table_name=jobs&queue_name=a%20b");
        assert_eq!(
            (d.scheme(), d.user(), d.host(), d.port(), d.path()),
            (
                "mysql",
                Some("root"),
                Some("127.0.0.1"),
                Some(3306),
                "/test"
            )
        );
        assert_eq!(d.option("queue_name"), Some("a b"));
        assert_eq!(d.expose_without_query(), "mysql://root@127.0.0.1:3306/test");
    }

    #[test]
    fn sqlite_and_bare_schemes_parse() {
        assert_eq!(dsn("sqlite://courier.db").host(), Some("courier.db"));
        assert_eq!(dsn("sqlite::memory:").path(), ":memory:");
        assert_eq!(dsn("sync://").scheme(), "sync");
        assert_eq!(dsn("in-memory://").scheme(), "in-memory");
    }

    #[test]
    fn unknown_options_are_named() {
        let err = dsn("in-memory://?colour=red")
            .check_options(&["redeliver_timeout"])
            .err()
            .map(|e| e.to_string());
        assert!(err.unwrap_or_default().contains("unknown option `colour`"));
    }

    #[test]
    fn missing_scheme_is_an_error() {
        assert!(Dsn::parse("courier.db").is_err());
    }
}
