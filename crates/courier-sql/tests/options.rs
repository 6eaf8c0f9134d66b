//! DSN handling: a table-name injection is refused with a clear error before any SQL runs, the
//! password never shows in errors, and the factory builds transports by scheme.

#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;

use courier_core::{Dsn, FactoryContext, TransportErrorKind, TransportRegistry};
use courier_sql::{SqlTransport, SqlTransportFactory};

#[tokio::test]
async fn a_table_name_injection_through_the_dsn_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let raw = format!(
        "sqlite://{}/x.db?table_name=courier_messages%20(id%20INT);%20DROP%20TABLE%20users;--",
        dir.path().display()
    );
    let dsn = Dsn::parse(&raw).unwrap();
    let err = SqlTransport::connect("async", &dsn, courier_test::registry())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), TransportErrorKind::Config);
    let shown = err.to_string();
    assert!(shown.contains("invalid table name"), "{shown}");
    assert!(
        shown.contains("[A-Za-z_][A-Za-z0-9_]* of at most 46 bytes"),
        "{shown}"
    );
    // Refused before connecting: no database file was created.
    assert!(!dir.path().join("x.db").exists());

    let registry = TransportRegistry::new().with(Arc::new(SqlTransportFactory));
    let err = registry
        .create(FactoryContext::new("async", dsn))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid table name"), "{err}");
}

#[tokio::test]
async fn the_password_never_shows_in_a_connection_error() {
    // A SQLite DSN with credentials and no host is refused by the DSN parser (an empty host);
    // with a host, by the connection. Neither error shows the password.
    let refused = Dsn::parse("sqlite://user:hunter2@/nonexistent-dir/x.db?mode=ro").unwrap_err();
    let shown = format!("{refused} {refused:?}");
    assert!(
        !shown.contains("hunter2") && shown.contains("***"),
        "{shown}"
    );
    let dsn = Dsn::parse("sqlite://user:hunter2@localhost/nonexistent-dir/x.db?mode=ro").unwrap();
    let err = SqlTransport::connect("async", &dsn, courier_test::registry())
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

/// A server that is down fails `connect` at once with the driver's own error, not with the
/// pool's "timed out" once its whole `acquire_timeout` (here 60 s) has passed.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[tokio::test]
async fn a_server_that_is_down_is_named_at_once_without_the_password() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut schemes = Vec::new();
    #[cfg(feature = "postgres")]
    schemes.push("postgres");
    #[cfg(feature = "mysql")]
    schemes.push("mysql");
    for scheme in schemes {
        let raw = format!("{scheme}://app:hunter2@127.0.0.1:{port}/test?acquire_timeout=60s");
        let dsn = Dsn::parse(&raw).unwrap();
        let connecting = SqlTransport::connect("async", &dsn, courier_test::registry());
        let err = tokio::time::timeout(std::time::Duration::from_secs(20), connecting)
            .await
            .unwrap_or_else(|_| panic!("{scheme}: still waiting for the pool's acquire_timeout"))
            .unwrap_err();
        assert_eq!(err.kind(), TransportErrorKind::Connection, "{scheme}");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("refused"), "{scheme}: {shown}");
        assert!(
            shown.contains(&format!("127.0.0.1:{port}")),
            "{scheme}: {shown}"
        );
        assert!(!shown.contains("hunter2"), "{scheme}: {shown}");
    }
}

#[tokio::test]
async fn an_unknown_option_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = Dsn::parse(&format!(
        "sqlite://{}/x.db?queue_nmae=a",
        dir.path().display()
    ))
    .unwrap();
    let err = SqlTransport::connect("async", &dsn, courier_test::registry())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown option `queue_nmae`"),
        "{err}"
    );
}

#[tokio::test]
async fn the_factory_builds_a_sqlite_transport_creating_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let dsn = Dsn::parse(&format!("sqlite://{}?queue_name=failed", path.display())).unwrap();
    let registry = TransportRegistry::new().with(Arc::new(SqlTransportFactory));
    let t = registry
        .create(FactoryContext::new("failed", dsn))
        .await
        .unwrap();
    assert!(path.exists());
    assert_eq!(
        t.as_message_count().unwrap().message_count().await.unwrap(),
        0
    );
}
