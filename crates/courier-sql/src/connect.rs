//! Picking the dialect from the DSN scheme and handing the driver its URL: the DSN without
//! Courier's own options (driver options such as `sslmode` pass through). The URL holds the
//! password; it goes to the driver only, errors show the redacted DSN.

use courier_core::{Dsn, TransportError, TransportErrorKind};

use crate::SqlOptions;
use crate::backend::Backend;
use crate::options::COURIER_OPTIONS;

/// The schemes this build handles ([`SqlTransportFactory::SCHEMES`](crate::SqlTransportFactory::SCHEMES)).
pub(crate) const SCHEMES: &[&str] = &[
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
];

/// Driver options passed through per dialect; anything else is a configuration error.
const SQLITE_DRIVER_OPTIONS: &[&str] = &["mode", "cache", "immutable", "vfs"];
const POSTGRES_DRIVER_OPTIONS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "options",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
];
const MYSQL_DRIVER_OPTIONS: &[&str] = &[
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "charset",
    "collation",
    "socket",
    "statement-cache-capacity",
];

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/' | b':') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL for the driver: scheme normalised, Courier's options removed.
fn driver_url(dsn: &Dsn, driver_options: &[&str]) -> Result<String, String> {
    let mut known: Vec<&str> = COURIER_OPTIONS.to_vec();
    known.extend_from_slice(driver_options);
    dsn.check_options(&known).map_err(|e| e.reason)?;
    let base = dsn.expose_without_query();
    let base = match dsn.scheme() {
        "mariadb" => format!("mysql{}", &base[base.find(':').unwrap_or(0)..]),
        "postgresql" => format!("postgres{}", &base[base.find(':').unwrap_or(0)..]),
        _ => base.to_owned(),
    };
    let pass: Vec<String> = dsn
        .options()
        .iter()
        .filter(|(k, _)| !COURIER_OPTIONS.contains(&k.as_str()))
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect();
    Ok(if pass.is_empty() {
        base
    } else {
        format!("{base}?{}", pass.join("&"))
    })
}

/// Connects the dialect named by the DSN's scheme.
pub(crate) async fn backend(
    name: &str,
    dsn: &Dsn,
    options: &SqlOptions,
) -> Result<Box<dyn Backend>, TransportError> {
    let config = |reason: String| {
        TransportError::new(TransportErrorKind::Config, name.to_owned())
            .with_context(format!("DSN `{dsn}`: {reason}"))
    };
    let connection = |e: sqlx::Error| {
        let kind = match &e {
            sqlx::Error::Configuration(_) => TransportErrorKind::Config,
            _ => TransportErrorKind::Connection,
        };
        TransportError::new(kind, name.to_owned())
            .with_context(format!("connecting to `{dsn}`"))
            .with_source(e)
    };
    match dsn.scheme() {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let url = driver_url(dsn, SQLITE_DRIVER_OPTIONS).map_err(config)?;
            Ok(Box::new(
                crate::sqlite::connect(&url, options)
                    .await
                    .map_err(connection)?,
            ))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let url = driver_url(dsn, POSTGRES_DRIVER_OPTIONS).map_err(config)?;
            Ok(Box::new(
                crate::postgres::connect(&url, options)
                    .await
                    .map_err(connection)?,
            ))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let url = driver_url(dsn, MYSQL_DRIVER_OPTIONS).map_err(config)?;
            Ok(Box::new(
                crate::mysql::connect(&url, options)
                    .await
                    .map_err(connection)?,
            ))
        }
        other => {
            let _ = (
                SQLITE_DRIVER_OPTIONS,
                POSTGRES_DRIVER_OPTIONS,
                MYSQL_DRIVER_OPTIONS,
                options,
            );
            Err(config(format!(
                "scheme `{other}` is not supported by this build (enabled: {})",
                SCHEMES.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn courier_options_are_stripped_and_driver_options_pass_through() {
        let dsn = Dsn::parse(
            "postgresql://u:p%40ss@db/app?queue_name=q&sslmode=disable&application_name=a%20b",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let url = driver_url(&dsn, POSTGRES_DRIVER_OPTIONS).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            url,
            "postgres://u:p%40ss@db/app?sslmode=disable&application_name=a%20b"
        );
    }

    #[test]
    fn unknown_options_are_rejected_by_name() {
        let dsn = Dsn::parse("sqlite://x.db?queue_nmae=q").unwrap_or_else(|e| panic!("{e}"));
        let err = driver_url(&dsn, SQLITE_DRIVER_OPTIONS)
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown option `queue_nmae`"), "{err}");
    }
}
