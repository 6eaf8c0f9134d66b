//! What differs in the SQL text between dialects, said once: the clock, placeholders, a few
//! words of vocabulary, and the one rule for table names. Statements are written once as
//! templates and rendered per dialect and table name when a store is built.

use std::fmt::Write as _;

/// A SQL dialect Courier speaks.
///
/// ```
/// use courier_sql::Dialect;
///
/// let sql = Dialect::Postgres.render("SELECT {now} FROM t WHERE a = ? AND b = ?");
/// assert!(sql.ends_with("WHERE a = $1 AND b = $2"));
/// assert_eq!(Dialect::from_dsn("mariadb://db/app").ok(), Some(Dialect::Mysql));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite 3.35+.
    Sqlite,
    /// PostgreSQL 12+.
    Postgres,
    /// MySQL 8 or MariaDB 10.6+.
    Mysql,
}

/// A DSN whose scheme names no SQL dialect; shows the scheme only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDialect(pub String);

impl std::fmt::Display for UnknownDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "scheme `{}` names no SQL dialect", self.0)
    }
}

impl std::error::Error for UnknownDialect {}

impl Dialect {
    /// The dialect of a URL scheme: `sqlite`, `postgres` / `postgresql`, `mysql` / `mariadb`.
    ///
    /// # Errors
    /// [`UnknownDialect`] for any other scheme.
    pub fn from_scheme(scheme: &str) -> Result<Self, UnknownDialect> {
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            other => Err(UnknownDialect(other.to_owned())),
        }
    }

    /// The dialect a DSN's scheme names.
    ///
    /// # Errors
    /// [`UnknownDialect`] for other schemes.
    pub fn from_dsn(dsn: &str) -> Result<Self, UnknownDialect> {
        Self::from_scheme(dsn.split(':').next().unwrap_or_default())
    }

    /// The expression giving the database clock in epoch milliseconds, fixed for a statement.
    #[must_use]
    pub fn now_ms_sql(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "(CAST(strftime('%s', 'now') AS INTEGER) * 1000 + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER))"
            }
            Self::Postgres => "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)",
            Self::Mysql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
        }
    }

    /// Renders a statement template for this dialect: `{now}` is the clock in epoch ms,
    /// `{greatest}` the two-argument maximum, `{bigint}` the 64-bit integer type of a `CAST`,
    /// `{skip_locked}` ` FOR UPDATE SKIP LOCKED` where rows can be locked; `?` placeholders
    /// become `$1, $2...` on PostgreSQL (templates hold no `?` in literals, so the binds of a
    /// statement are in the same order on every dialect).
    #[must_use]
    pub fn render(self, template: &str) -> String {
        let (greatest, bigint, skip_locked) = match self {
            Self::Sqlite => ("MAX", "INTEGER", ""),
            Self::Postgres => ("GREATEST", "BIGINT", " FOR UPDATE SKIP LOCKED"),
            Self::Mysql => ("GREATEST", "SIGNED", " FOR UPDATE SKIP LOCKED"),
        };
        let sql = template
            .replace("{now}", self.now_ms_sql())
            .replace("{greatest}", greatest)
            .replace("{bigint}", bigint)
            .replace("{skip_locked}", skip_locked);
        if self != Self::Postgres {
            return sql;
        }
        let mut out = String::with_capacity(sql.len() + 8);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                let _ = write!(out, "${n}");
            } else {
                out.push(c);
            }
        }
        out
    }
}

/// The longest table name: PostgreSQL keeps 63 bytes of a name, and the longest name derived
/// from a table (`<table>_status_lease_idx`, 17 more) must fit too.
pub const MAX_TABLE_NAME_LEN: usize = 46;

/// A table beside a message table, named for `what`: `_messages` replaced by `_<what>`, or
/// `_<what>` appended (`courier_messages` -> `courier_workers`, `jobs` -> `jobs_workers`). The
/// message table is a validated identifier, so this one is too.
pub(crate) fn beside(messages_table: &str, what: &str) -> String {
    match messages_table.strip_suffix("_messages") {
        Some(stem) if !stem.is_empty() => format!("{stem}_{what}"),
        _ => format!("{messages_table}_{what}"),
    }
}

/// Whether `name` is a valid table name: `[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`MAX_TABLE_NAME_LEN`] bytes. Only names that pass reach the SQL text.
///
/// ```
/// use courier_sql::is_valid_identifier;
/// assert!(is_valid_identifier("courier_messages"));
/// assert!(!is_valid_identifier("x; DROP TABLE users"));
/// ```
#[must_use]
pub fn is_valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && name.len() <= MAX_TABLE_NAME_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The error text for a table name that [`is_valid_identifier`] refuses.
#[must_use]
pub fn invalid_table_name(name: &str) -> String {
    format!(
        "invalid table name `{}`: expected [A-Za-z_][A-Za-z0-9_]* of at most {MAX_TABLE_NAME_LEN} bytes",
        name.escape_debug()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_beside_a_message_table_share_its_stem_and_fit_postgres_names() {
        assert_eq!(crate::workers_table("courier_messages"), "courier_workers");
        assert_eq!(
            crate::schedules_table("courier_messages"),
            "courier_schedules"
        );
        assert_eq!(crate::paused_table("courier_messages"), "courier_paused");
        assert_eq!(crate::limits_table("courier_messages"), "courier_limits");
        assert_eq!(crate::workers_table("jobs"), "jobs_workers");
        assert_eq!(crate::schedules_table("jobs"), "jobs_schedules");
        assert_eq!(crate::workers_table("_messages"), "_messages_workers");
        let longest = "a".repeat(MAX_TABLE_NAME_LEN);
        for name in [
            crate::workers_table(&longest),
            crate::schedules_table(&longest),
            crate::paused_table(&longest),
            crate::limits_table(&longest),
        ] {
            assert!(name.len() <= 63, "fits PostgreSQL's names: {name}");
        }
    }

    #[test]
    fn identifiers_are_validated() {
        for ok in [
            "courier_messages",
            "_x",
            "A1",
            &"a".repeat(MAX_TABLE_NAME_LEN),
        ] {
            assert!(is_valid_identifier(ok), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "x;drop table y",
            "t\"",
            "é",
            &"a".repeat(MAX_TABLE_NAME_LEN + 1),
        ] {
            assert!(!is_valid_identifier(bad), "{bad}");
        }
    }

    #[test]
    fn placeholders_are_numbered_on_postgres_only() {
        let t = "UPDATE t SET a = {now} + ? WHERE id = ? AND b = {greatest}(x, y)";
        assert_eq!(
            Dialect::Postgres.render(t),
            format!(
                "UPDATE t SET a = {} + $1 WHERE id = $2 AND b = GREATEST(x, y)",
                Dialect::Postgres.now_ms_sql()
            )
        );
        assert!(
            Dialect::Sqlite
                .render(t)
                .ends_with("id = ? AND b = MAX(x, y)")
        );
        assert!(Dialect::Mysql.render(t).contains("+ ? WHERE id = ?"));
    }

    #[test]
    fn dialect_comes_from_the_scheme() {
        assert_eq!(
            Dialect::from_dsn("sqlite://x.db").ok(),
            Some(Dialect::Sqlite)
        );
        assert_eq!(
            Dialect::from_dsn("postgresql://h/db").ok(),
            Some(Dialect::Postgres)
        );
        assert_eq!(
            Dialect::from_dsn("mariadb://h/db").ok(),
            Some(Dialect::Mysql)
        );
        assert!(Dialect::from_dsn("redis://h").is_err());
    }
}
