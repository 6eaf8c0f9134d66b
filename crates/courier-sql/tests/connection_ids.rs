//! MySQL / MariaDB: the server ids a transport knows for its connections (what tests kill) are
//! those of live connections only, however often the pool replaces them.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::Duration;

use courier_core::{Envelope, Transport};
use courier_test::TestMessage;

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
async fn connection_ids_forget_connections_the_server_closed() {
    let h = common::mysql().await;
    let (t, _) = h.make("&max_connections=1").await;
    let common::Admin::MySql(admin) = &h.admin else {
        unreachable!("a mysql harness");
    };
    for n in 0..4 {
        let ids = t.server_connection_ids();
        assert!(!ids.is_empty());
        for id in &ids {
            let _ = sqlx::query(&format!("KILL {id}")).execute(admin).await;
        }
        // Wait until the server has let the killed sessions go.
        let list = ids
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let gone =
            format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({list})");
        for _ in 0..50 {
            let left: i64 = sqlx::query_scalar(&gone).fetch_one(admin).await.unwrap();
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The next operation replaces the connection (retrying the killed one).
        tokio::time::timeout(
            Duration::from_secs(20),
            t.send(Envelope::new(TestMessage::new(n))),
        )
        .await
        .unwrap()
        .unwrap();
    }
    let ids = t.server_connection_ids();
    assert_eq!(ids.len(), 1, "only the live connection is known: {ids:?}");
}
