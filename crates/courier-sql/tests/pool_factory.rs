//! `pool://NAME` in a configuration: the transport runs on the pool handed over in code as
//! `NAME` (`SqlPoolFactory`), sharing it with the application; an unknown name is a
//! configuration error naming it and the pools registered.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::sync::Arc;
use std::time::Duration;

use courier_core::config::Config;
use courier_core::{Envelope, MessageRegistry, TransportRegistry};
use courier_sql::SqlPoolFactory;
use courier_test::TestMessage;

#[tokio::test]
async fn a_configured_pool_dsn_runs_on_the_pool_handed_over_in_code() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("app.db").display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    let factories =
        TransportRegistry::new().with(Arc::new(SqlPoolFactory::new().pool("main", pool.clone())));
    let config: Config =
        "[transports.async]\ndsn = \"pool://main?table_name=app_jobs&queue_name=emails\"\n"
            .parse()
            .unwrap();
    let registry = Arc::new(MessageRegistry::new().with::<TestMessage>());
    let transports = config.connect(&factories, registry.clone()).await.unwrap();
    let queue = transports.get("async").unwrap();
    queue
        .send(Envelope::new(TestMessage::new(7)))
        .await
        .unwrap();
    // The row is in the application's database, written through its pool.
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM app_jobs WHERE queue_name = 'emails'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let got = tokio::time::timeout(Duration::from_secs(10), queue.get(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got[0].message::<TestMessage>().map(|m| m.seq), Some(7));
    queue.ack(&got[0]).await.unwrap();
    drop(transports);
    assert!(
        !pool.is_closed(),
        "Courier never closes the application's pool"
    );

    let unknown: Config = "[transports.async]\ndsn = \"pool://other\"\n"
        .parse()
        .unwrap();
    let err = unknown
        .connect(&factories, registry)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("no pool `other` was handed over in code (registered: main)"),
        "{err}"
    );
}
