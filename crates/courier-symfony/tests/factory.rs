//! Symfony's Doctrine table from the configuration: `symfony+...` DSNs with Symfony's option
//! names, `[symfony.types]`, and no password in errors or `Debug`.

#![cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{SendEmail, email, registry, serializer};
use courier_core::config::Config;
use courier_core::{Dsn, Envelope, FactoryContext, Transport, TransportRegistry};
use courier_symfony::{DoctrineOptions, DoctrineTransport, SymfonyTransportFactory, SymfonyTypes};

fn factories(types: SymfonyTypes) -> TransportRegistry {
    TransportRegistry::new().with(Arc::new(SymfonyTransportFactory::new(types)))
}

async fn create(
    registry: &TransportRegistry,
    dsn: &str,
) -> Result<Arc<dyn courier_core::Transport>, courier_core::TransportError> {
    let ctx = FactoryContext::new("async", Dsn::parse(dsn).unwrap()).registry(common::registry());
    tokio::time::timeout(Duration::from_secs(60), registry.create(ctx))
        .await
        .expect("in time")
}

#[tokio::test]
async fn a_configured_transport_writes_the_table_php_reads_with_its_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("messenger.db");
    let config: Config = format!(
        "[transports.async]\n\
         dsn = \"symfony+sqlite://{}?table_name=mm&queue_name=emails&timezone=America/New_York&redeliver_timeout=600\"\n\
         [symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n",
        path.display()
    )
    .parse()
    .unwrap();
    let registry_of_config = TransportRegistry::new().with(Arc::new(
        SymfonyTransportFactory::from_config(&config).unwrap(),
    ));
    let transports = config
        .connect(&registry_of_config, registry())
        .await
        .unwrap();
    let t = transports.get("async").unwrap();
    assert_eq!(t.messaging_system(), "sqlite");
    assert_eq!(
        t.capabilities().redeliver_after,
        Some(Duration::from_secs(600)),
        "redeliver_timeout"
    );
    t.send(Envelope::new(email(7, "-04:00"))).await.unwrap();

    // The same table and queue as PHP would open them.
    let direct = DoctrineTransport::connect(
        "direct",
        &format!("sqlite://{}", path.display()),
        DoctrineOptions::default()
            .table_name("mm")
            .queue_name("emails")
            .zone(chrono_tz::America::New_York),
        serializer(),
        registry(),
    )
    .await
    .unwrap();
    let got = direct.get(10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message::<SendEmail>(), Some(&email(7, "-04:00")));
    assert_eq!(
        got[0].message_name(),
        "mail.send",
        "written as App\\Message\\SendEmail, mapped back"
    );
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let headers: String = sqlx::query_scalar("SELECT headers FROM mm")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        headers.contains(r#""type":"App\\Message\\SendEmail""#),
        "{headers}"
    );
    // Wall-clock in the configured zone: New York is 4 or 5 hours behind UTC.
    let behind: i64 = sqlx::query_scalar(
        "SELECT CAST(ROUND((julianday('now') - julianday(created_at)) * 24) AS INTEGER) FROM mm",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(behind == 4 || behind == 5, "{behind} hours");
}

#[tokio::test]
async fn serializer_symfony_on_a_plain_dsn_is_symfonys_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("messenger.db");
    let config: Config = format!(
        "[transports.async]\ndsn = \"sqlite://{}\"\nserializer = \"symfony\"\n\
         options = {{ queue_name = \"emails\" }}\n\
         [symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n",
        path.display()
    )
    .parse()
    .unwrap();
    let factories = factories(SymfonyTypes::from_config(&config).unwrap());
    let transports = config.connect(&factories, registry()).await.unwrap();
    transports
        .get("async")
        .unwrap()
        .send(Envelope::new(email(3, "+00:00")))
        .await
        .unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let (queue, headers): (String, String) =
        sqlx::query_as("SELECT queue_name, headers FROM messenger_messages")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queue, "emails", "the option reached Symfony's layout");
    assert!(
        headers.contains(r#""type":"App\\Message\\SendEmail""#),
        "{headers}"
    );
}

#[tokio::test]
async fn a_factory_without_types_keeps_php_classes() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("symfony+sqlite://{}", dir.path().join("m.db").display());
    let plain = create(&factories(SymfonyTypes::new()), &dsn).await.unwrap();
    let typed = create(
        &factories(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send")),
        &dsn,
    )
    .await
    .unwrap();
    typed.send(Envelope::new(email(1, "+00:00"))).await.unwrap();
    let got = plain.get(1).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_name(), r"App\Message\SendEmail");
    assert!(got[0].decode_error().is_some());
}

#[tokio::test]
async fn an_unknown_option_is_refused_by_name_without_the_password() {
    let registry = factories(SymfonyTypes::new());
    let err = create(
        &registry,
        "symfony+postgres://app:hunter2@127.0.0.1:1/app?queue_name=q&delay=5",
    )
    .await
    .map(drop)
    .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("unknown option `delay`"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let err = create(&registry, "symfony+sqlite:///x.db?timezone=Mars/Base")
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("`timezone`"), "{err}");
    let err = create(&registry, "symfony+nats://127.0.0.1")
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("unknown scheme"), "{err}");
}

/// Slow: the driver retries the connection for its acquire timeout (30 s) before it fails.
#[tokio::test]
#[ignore = "slow: 30 s of connection retries"]
async fn a_failed_connection_does_not_show_the_password() {
    let registry = factories(SymfonyTypes::new());
    for dsn in ["symfony+postgres://app:hunter2@127.0.0.1:1/app"] {
        let err = create(&registry, dsn).await.map(drop).unwrap_err();
        let text = format!("{} {err:?}", courier_core::error_chain(&err));
        assert!(!text.contains("hunter2"), "{text}");
    }
    assert!(!format!("{registry:?}").contains("hunter2"));
}

#[test]
fn the_class_map_comes_from_symfony_types_and_a_stray_key_is_named() {
    let config: Config = "[symfony.types]\n\"App\\\\Message\\\\SendEmail\" = \"mail.send\"\n"
        .parse()
        .unwrap();
    let types = SymfonyTypes::from_config(&config).unwrap();
    assert_eq!(types.wire_name(r"App\Message\SendEmail"), Some("mail.send"));
    assert!(
        SymfonyTypes::from_config(&Config::default())
            .unwrap()
            .is_empty()
    );
    let config: Config = "[symfony]\ntype = {}\n".parse().unwrap();
    let err = SymfonyTypes::from_config(&config).unwrap_err().to_string();
    assert!(err.contains("type"), "{err}");
}
