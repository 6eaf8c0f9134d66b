//! DSNs: `scheme://user:password@host:port/path?option=value`, with the password redacted in
//! every `Debug` and `Display`, and so is a token written in the user's place
//! (`nats://TOKEN@host`, `redis://TOKEN@host`): user info without a `:` is shown only for the
//! schemes that read it as a user name (`postgres`, `postgresql`, `mysql`, `mariadb`, `amqp`,
//! `amqps`).
//!
//! A password may hold `+` and `=` as written (base64 secrets often do): `+` is a plus, never a
//! space. `/`, `?` and `#` end the host part of a URL, so in a password they must be
//! percent-encoded (`%2F`, `%3F`, `%23`); a DSN that holds them as written is refused with that
//! hint, and is redacted all the same: [`redact`] does not depend on the DSN parsing. Drivers
//! get the DSN with the user info percent-encoded ([`Dsn::expose`]).

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
    /// `raw` with the user info percent-encoded: what drivers get.
    exposed: String,
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

/// The schemes whose user info without a `:` is a user name, shown as written
/// (`postgres://app@db`); under any other scheme it is taken for a token (`nats://TOKEN@host`,
/// `redis://TOKEN@host`) and redacted like a password (`nats://***@host`).
const USER_NAME_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "amqp",
    "amqps",
];

/// Whether user info without a `:` is a user name under `scheme` (else it may be a token).
fn lone_user_is_a_name(scheme: &str) -> bool {
    USER_NAME_SCHEMES
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
}

/// Redacts the password of anything that looks like a DSN (for error messages and logs).
///
/// The rule does not depend on the DSN parsing: everything between `://` and the last `@`
/// after it is the user info, shown as `user:***` (the user is what comes before its first
/// `:`). So a password holding `/`, `?`, `#` or `@` is hidden even in a DSN that is otherwise
/// malformed. User info without a `:` is shown only under the schemes that read it as a user
/// name (`postgres`, `postgresql`, `mysql`, `mariadb`, `amqp`, `amqps`); under any other it may
/// be a token (`nats://TOKEN@host`) and is shown as `***`. Query options
/// named like secrets (`password`, `token`, ...) are redacted too.
///
/// ```
/// assert_eq!(
///     courier_core::redact("postgres://app:ab/cd+ef==@db:5432/app"),
///     "postgres://app:***@db:5432/app"
/// );
/// assert_eq!(courier_core::redact("nats://s3cr3t@db:4222"), "nats://***@db:4222");
/// ```
#[must_use]
pub fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let start = scheme_end + 3;
    let out = match userinfo_end(&raw[start..]) {
        Some(at) => {
            let userinfo = &raw[start..start + at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &raw[..start], &raw[start + at..]),
                None if userinfo.is_empty()
                    || lone_user_is_a_name(scheme_of(&raw[..scheme_end])) =>
                {
                    raw.to_owned()
                }
                None => format!("{}***{}", &raw[..start], &raw[start + at..]),
            }
        }
        None => raw.to_owned(),
    };
    redact_query_secrets(&out)
}

/// The scheme ending `text` (what precedes `://`): its last run of scheme characters, so
/// ``"`postgres"`` gives `postgres`.
fn scheme_of(text: &str) -> &str {
    let start = text
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .map_or(0, |i| i + 1);
    &text[start..]
}

/// Where the user info of the text after `//` ends: its last `@`. `None` when there is no `@`,
/// when the authority is empty (`sqlite:///tmp/a@b.db`), or when the text before the `@` has
/// no `:` but a `/`, `?` or `#` (`redis://host?consumer=a@b`: a path or query, not a user).
fn userinfo_end(after: &str) -> Option<usize> {
    if after.starts_with('/') {
        return None;
    }
    let at = after.rfind('@')?;
    let candidate = &after[..at];
    if !candidate.contains(':') && candidate.contains(['/', '?', '#']) {
        return None;
    }
    Some(at)
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

/// Decodes the `%XX` escapes of a part the URL parser left encoded (user, password, host).
fn percent_decode(raw: &str, s: &str) -> Result<String, DsnError> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| DsnError::new(raw, "percent-escape is not UTF-8"))
}

/// Everything but the unreserved characters of RFC 3986.
const NOT_UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What a URL's host may not hold as written but a DSN's may (a SQLite file's directory
/// `sqlite://dir with space/x.db`): encoded before the URL parser sees it, decoded with the host.
const NOT_IN_A_HOST: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'<')
    .add(b'>')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Percent-encodes everything but the unreserved characters of RFC 3986.
fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

/// Why a DSN whose password holds `/`, `?` or `#` as written does not parse (quoting no part
/// of it).
const UNENCODED_USERINFO: &str = "the user or password holds `/`, `?` or `#`, which end the host \
     part of a URL: percent-encode them (`/` as `%2F`, `?` as `%3F`, `#` as `%23`)";

/// The error of a DSN the URL parser refused, in words that name no secret: `rest` is what
/// follows `scheme:`.
fn url_error(raw: &str, rest: &str, error: url::ParseError) -> DsnError {
    let after = rest.strip_prefix("//").unwrap_or_default();
    let authority = &after[..after.find(['/', '?', '#']).unwrap_or(after.len())];
    if userinfo_end(after).is_some_and(|at| at > authority.len()) {
        // `user:ab/cd@db`: the authority ends inside the password.
        return DsnError::new(raw, UNENCODED_USERINFO);
    }
    match error {
        url::ParseError::InvalidPort => {
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let port = host_port.rsplit_once(':').map_or("", |(_, p)| p);
            DsnError::new(raw, format!("invalid port `{port}`"))
        }
        other => DsnError::new(raw, other.to_string()),
    }
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
        let escaped = percent_encoding::utf8_percent_encode(raw, NOT_IN_A_HOST).to_string();
        let url = url::Url::parse(&escaped).map_err(|e| url_error(raw, rest, e))?;
        let (user, password) = if url.username().is_empty() && url.password().is_none() {
            // `redis://@host`: an empty user info is no user.
            let empty = rest.strip_prefix("//").is_some_and(|a| a.starts_with('@'));
            (empty.then(String::new), None)
        } else {
            (
                Some(percent_decode(raw, url.username())?),
                url.password().map(|p| percent_decode(raw, p)).transpose()?,
            )
        };
        // Drivers get the user info percent-encoded, the rest as written.
        let exposed = match (&user, rest.strip_prefix("//")) {
            (Some(u), Some(after)) if !u.is_empty() || password.is_some() => {
                let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
                let at = after[..authority_end].rfind('@').unwrap_or_default();
                format!(
                    "{scheme}://{}{}@{}",
                    percent_encode(u),
                    password
                        .as_deref()
                        .map(|p| format!(":{}", percent_encode(p)))
                        .unwrap_or_default(),
                    &after[at + 1..]
                )
            }
            _ => raw.to_owned(),
        };
        // The path as written (the URL parser would percent-encode `>` or a space in it).
        let path = match rest.strip_prefix("//") {
            Some(after) => {
                let before_query = &after[..after.find(['?', '#']).unwrap_or(after.len())];
                &before_query[before_query.find('/').unwrap_or(before_query.len())..]
            }
            None => &rest[..rest.find(['?', '#']).unwrap_or(rest.len())],
        };
        let host = match url.host_str().filter(|h| !h.is_empty()) {
            Some(h) => Some(percent_decode(raw, h)?),
            None => None,
        };
        Ok(Self {
            raw: raw.to_owned(),
            exposed,
            scheme: scheme.to_ascii_lowercase(),
            user,
            password,
            host,
            port: url.port(),
            path: path.to_owned(),
            options: url.query_pairs().into_owned().collect(),
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

    /// Every secret the DSN holds, to scrub from text that did not go through [`redact`]
    /// (a driver's error quoting one): the password, the user info without a `:` under a
    /// scheme that does not read it as a user name (a token: `nats://TOKEN@host`, see
    /// [`redact`]), and the values of query options named like secrets
    /// (`password`, `token`, ...). Never log them.
    #[must_use]
    pub fn secrets(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.password.iter().map(String::as_str).collect();
        if self.password.is_none() && !lone_user_is_a_name(&self.scheme) {
            out.extend(self.user.as_deref().filter(|u| !u.is_empty()));
        }
        out.extend(
            self.options
                .iter()
                .filter(|(k, v)| is_secret_key(k) && !v.is_empty())
                .map(|(_, v)| v.as_str()),
        );
        out
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

    /// Drops an option, if set.
    ///
    /// ```
    /// use courier_core::Dsn;
    ///
    /// let dsn = Dsn::parse("redis://h?stream=s&concurrency_max=10")?.without_option("concurrency_max");
    /// assert_eq!(dsn.option("concurrency_max"), None);
    /// assert_eq!(dsn.option("stream"), Some("s"));
    /// # Ok::<(), courier_core::DsnError>(())
    /// ```
    #[must_use]
    pub fn without_option(mut self, key: &str) -> Self {
        self.options.retain(|(k, _)| k != key);
        self
    }

    /// The same DSN under the scheme `prefix` + its scheme (`symfony+` makes `redis://h/s`
    /// `symfony+redis://h/s`); `prefix` is lowercased, like every scheme.
    ///
    /// ```
    /// use courier_core::Dsn;
    ///
    /// let dsn = Dsn::parse("Redis://:pw@h/messages?serializer=0")?.with_scheme_prefix("symfony+");
    /// assert_eq!(dsn.scheme(), "symfony+redis");
    /// assert_eq!(dsn.expose(), "symfony+Redis://:pw@h/messages?serializer=0");
    /// assert_eq!(dsn.path(), "/messages");
    /// # Ok::<(), courier_core::DsnError>(())
    /// ```
    #[must_use]
    pub fn with_scheme_prefix(&self, prefix: &str) -> Self {
        let mut dsn = self.clone();
        let prefix = prefix.to_ascii_lowercase();
        dsn.raw = format!("{prefix}{}", self.raw);
        dsn.exposed = format!("{prefix}{}", self.exposed);
        dsn.scheme = format!("{prefix}{}", self.scheme);
        dsn
    }

    /// The DSN for a driver, password included: as written, except that the user and password
    /// are percent-encoded (`ab/cd+ef==` becomes `ab%2Fcd%2Bef%3D%3D`), so a URL parser reads
    /// them back exactly. Never log it.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.exposed
    }

    /// [`Dsn::expose`] without its query string (the form drivers take when Courier consumes
    /// the options itself). Contains the password: never log it.
    #[must_use]
    pub fn expose_without_query(&self) -> &str {
        self.exposed
            .split_once('?')
            .map_or(&self.exposed, |(a, _)| a)
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
        let spaced = dsn("sqlite://dir with space/courier \"x\".db?queue_name=a");
        assert_eq!(spaced.host(), Some("dir with space"));
        assert_eq!(spaced.path(), "/courier \"x\".db");
        assert_eq!(spaced.option("queue_name"), Some("a"));
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
    fn redaction_hides_everything_up_to_the_last_at_whether_or_not_the_dsn_parses() {
        for (raw, shown) in [
            (
                "postgres://user:ab/cd+ef==@db:5432/app",
                "postgres://user:***@db:5432/app",
            ),
            ("postgres://user:ab#cd@db/app", "postgres://user:***@db/app"),
            (
                "postgres://user:ab?cd=@db/app?x=1",
                "postgres://user:***@db/app?x=1",
            ),
            ("redis://:s3/cr?t@host:6379", "redis://:***@host:6379"),
            ("amqp://u:p@ss@w0rd@host/%2f", "amqp://u:***@host/%2f"),
            (
                "mysql://user:ab/cd@db:notaport/x",
                "mysql://user:***@db:notaport/x",
            ),
            ("`postgres://u:ab/cd@db`:", "`postgres://u:***@db`:"),
            ("sqlite:///tmp/a@b/x.db", "sqlite:///tmp/a@b/x.db"),
            (
                "redis://localhost?consumer=a@b",
                "redis://localhost?consumer=a@b",
            ),
            ("postgres://app@db/app", "postgres://app@db/app"),
        ] {
            assert_eq!(redact(raw), shown, "{raw}");
        }
    }

    #[test]
    fn a_password_holding_slash_hash_or_question_mark_is_refused_without_showing_it() {
        for secret in ["ab/cd+ef==", "ab#cd", "ab?cd", "a/b?c#d+e="] {
            for raw in [
                format!("postgres://user:{secret}@db:5432/app?queue_name=q"),
                format!("redis://:{secret}@db"),
            ] {
                let err = Dsn::parse(&raw)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(err.contains("percent-encode"), "{err}");
                assert!(err.contains(":***@db"), "{err}");
                for part in secret.split(['/', '?', '#']).filter(|p| p.len() > 1) {
                    assert!(!err.contains(part), "{part} in {err}");
                }
            }
        }
        // Percent-encoded, the same password parses.
        let d = dsn("postgres://user:ab%2Fcd+ef%3D%3D@db:5432/app");
        assert_eq!(d.password(), Some("ab/cd+ef=="));
        assert_eq!(d.to_string(), "postgres://user:***@db:5432/app");
        // `@` and `:` need no encoding in a password; `@` in an option value neither.
        assert_eq!(dsn("amqp://u:p@ss:w@host/%2f").password(), Some("p@ss:w"));
        let d = dsn("redis://localhost:6379?consumer=a@b");
        assert_eq!((d.host(), d.port()), (Some("localhost"), Some(6379)));
        assert_eq!(d.option("consumer"), Some("a@b"));
    }

    #[test]
    fn a_dsn_error_never_shows_a_password_holding_a_slash() {
        let err = Dsn::parse("postgres://user:ab/cd+ef==@db:nope/app")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("postgres://user:***@db:nope/app"), "{err}");
        assert!(!err.contains("ab") && !err.contains("ef=="), "{err}");
    }

    #[test]
    fn a_plus_in_a_password_stays_a_plus_and_reaches_the_driver_encoded() {
        let d = dsn("postgres://user:a+b=c==@db/app?queue_name=a+b");
        assert_eq!(d.password(), Some("a+b=c=="));
        assert_eq!(d.to_string(), "postgres://user:***@db/app?queue_name=a+b");
        assert_eq!(
            d.expose_without_query(),
            "postgres://user:a%2Bb%3Dc%3D%3D@db/app"
        );
        assert_eq!(
            d.expose(),
            "postgres://user:a%2Bb%3Dc%3D%3D@db/app?queue_name=a+b"
        );
        // Query options keep form encoding.
        assert_eq!(d.option("queue_name"), Some("a b"));
        assert_eq!(dsn("redis://:p%2Bq@h").password(), Some("p+q"));
        // Without user info the DSN reaches the driver exactly as written.
        assert_eq!(
            dsn("sqlite://dir/a+b.db?x=1").expose(),
            "sqlite://dir/a+b.db?x=1"
        );
    }

    #[test]
    fn a_token_in_the_users_place_never_shows() {
        for (raw, shown) in [
            ("nats://s3cr3tT0ken@host:4222", "nats://***@host:4222"),
            ("redis://s3cr3tT0ken@host:6379/0", "redis://***@host:6379/0"),
            ("rediss://s3cr3tT0ken@host?db=1", "rediss://***@host?db=1"),
            ("NATS://s3cr3tT0ken@host", "NATS://***@host"),
            ("x-custom+tls://s3cr3tT0ken@host", "x-custom+tls://***@host"),
            // In a message, as `scrub` sees each word.
            ("`nats://s3cr3tT0ken@host`:", "`nats://***@host`:"),
            ("(redis://s3cr3tT0ken@h)", "(redis://***@h)"),
            // Where a lone user info is a user name, it stays.
            ("postgres://app@db/app", "postgres://app@db/app"),
            ("postgresql://app@db/app", "postgresql://app@db/app"),
            ("mysql://root@db:3306/x", "mysql://root@db:3306/x"),
            ("mariadb://root@db/x", "mariadb://root@db/x"),
            ("amqp://guest@host/%2f", "amqp://guest@host/%2f"),
            ("AMQPS://guest@host", "AMQPS://guest@host"),
            ("redis://@host", "redis://@host"),
        ] {
            assert_eq!(redact(raw), shown, "{raw}");
        }
        let d = dsn("nats://s3cr3tT0ken@host:4222?stream=s");
        assert_eq!(d.user(), Some("s3cr3tT0ken"));
        for shown in [format!("{d}"), format!("{d:?}"), format!("{d:#?}")] {
            assert!(!shown.contains("s3cr3tT0ken"), "{shown}");
            assert!(shown.contains("nats://***@host:4222?stream=s"), "{shown}");
        }
        let d = dsn("redis://s3cr3tT0ken@host");
        assert_eq!(d.to_string(), "redis://***@host");
        assert!(!format!("{d:?}").contains("s3cr3tT0ken"));
        // Errors about the DSN.
        let bad_port = Dsn::parse("nats://s3cr3tT0ken@host:notaport")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            bad_port.contains("nats://***@host:notaport") && bad_port.contains("invalid port"),
            "{bad_port}"
        );
        let unknown = dsn("redis://s3cr3tT0ken@host?colour=red")
            .check_options(&["stream"])
            .err()
            .map(|e| format!("{e} {e:?}"))
            .unwrap_or_default();
        assert!(unknown.contains("unknown option `colour`"), "{unknown}");
        assert!(!unknown.contains("s3cr3tT0ken"), "{unknown}");
        let bad_value = dsn("nats://s3cr3tT0ken@host?ack_wait=soon")
            .duration_option("ack_wait")
            .err()
            .map(|e| format!("{e} {e:?}"))
            .unwrap_or_default();
        assert!(bad_value.contains("ack_wait"), "{bad_value}");
        assert!(!bad_value.contains("s3cr3tT0ken"), "{bad_value}");
    }

    #[test]
    fn secrets_name_the_password_the_token_and_secret_options() {
        assert_eq!(
            dsn("postgres://app:hunter2@db/app?sslmode=disable").secrets(),
            ["hunter2"]
        );
        assert!(dsn("postgres://app@db/app").secrets().is_empty());
        assert!(dsn("sqlite://courier.db").secrets().is_empty());
        assert_eq!(dsn("nats://s3cr3tT0ken@host").secrets(), ["s3cr3tT0ken"]);
        assert_eq!(dsn("redis://s%2Fcr3t@host").secrets(), ["s/cr3t"]);
        assert_eq!(
            dsn("nats://host?token=t0k3n&stream=s&password=").secrets(),
            ["t0k3n"]
        );
        assert_eq!(
            dsn("redis://user:pw@host?auth_token=abc").secrets(),
            ["pw", "abc"]
        );
        assert!(dsn("redis://@host").secrets().is_empty());
    }

    #[test]
    fn missing_scheme_is_an_error() {
        assert!(Dsn::parse("courier.db").is_err());
    }
}
