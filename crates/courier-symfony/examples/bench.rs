//! Throughput of a Symfony-format queue (Symfony's Doctrine table, its JSON serializer) beside
//! Courier's own SQL transport and format, each in a table of its own (on SQLite a file each),
//! and of the two serializers alone:
//!
//!     cargo run --release -p courier-symfony --features sqlite --example bench [messages]
//!     cargo run --release -p courier-symfony --features sqlite,postgres --example bench \
//!         [messages] [postgres://user:pass@host/db]
//!
//! Each queue gets the same messages, sent in batches of 100 and received and acked in batches
//! of 100, in three rounds taken in turns (the best of each side counts, as the machine's load
//! varies); the ratio is Symfony's rate over Courier's. On a server both tables get a unique
//! name and are dropped at the end.

use std::sync::Arc;
use std::time::Instant;

use courier_core::{Dsn, Envelope, Message, MessageRegistry, Transport};
use courier_sql::SqlTransport;
use courier_symfony::{DoctrineOptions, DoctrineTransport, SymfonySerializer, SymfonyTypes};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendEmail {
    id: u64,
    to: String,
    subject: String,
    tags: Vec<String>,
}

impl Message for SendEmail {
    const NAME: &'static str = "mail.send";
}

fn email(id: u64) -> SendEmail {
    SendEmail {
        id,
        to: format!("user{id}@example.com"),
        subject: format!("Your order {id} has shipped"),
        tags: vec!["orders".into(), "email".into()],
    }
}

/// Sends, receives and acks `n` messages; messages per second.
async fn run(t: &dyn Transport, n: u64) -> anyhow::Result<f64> {
    let start = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let envelopes = chunk.iter().map(|&i| Envelope::new(email(i))).collect();
        t.send_batch(envelopes).await?;
    }
    let sent_in = start.elapsed();
    let mut received = 0;
    while received < n {
        let batch = t.get(100).await?;
        anyhow::ensure!(!batch.is_empty(), "queue drained early at {received}");
        received += batch.len() as u64;
        t.ack_batch(&batch).await?;
    }
    let total = start.elapsed();
    println!(
        "  {}: send {:.0} ms, get + ack {:.0} ms",
        t.messaging_system(),
        sent_in.as_secs_f64() * 1e3,
        (total - sent_in).as_secs_f64() * 1e3
    );
    Ok(n as f64 / total.as_secs_f64())
}

fn serializers(n: u64) -> anyhow::Result<(f64, f64)> {
    let registry = MessageRegistry::new().with::<SendEmail>();
    let symfony =
        SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send"));
    let time = |f: &dyn Fn(u64) -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let start = Instant::now();
        for i in 0..n {
            f(i)?;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    };
    let courier = time(&|i| {
        let wire = registry.encode(&Envelope::new(email(i)))?;
        let back = registry.decode(wire);
        anyhow::ensure!(back.message::<SendEmail>().is_some());
        Ok(())
    })?;
    let symfony = time(&|i| {
        let wire = symfony.encode(&registry, &Envelope::new(email(i)))?;
        let headers = wire.headers_json();
        let back = symfony.decode(&registry, wire.body, &headers);
        anyhow::ensure!(back.message::<SendEmail>().is_some());
        Ok(())
    })?;
    Ok((courier, symfony))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args().nth(1).map_or(Ok(10_000), |a| a.parse())?;
    let server = std::env::args().nth(2);
    let dir = tempfile::tempdir()?;
    let registry = Arc::new(MessageRegistry::new().with::<SendEmail>());
    let suffix = std::process::id();
    let (courier_table, symfony_table) = (
        format!("bench_courier_{suffix}"),
        format!("bench_symfony_{suffix}"),
    );
    let (courier_url, symfony_url, database) = match &server {
        Some(url) => (
            format!("{url}?table_name={courier_table}&queue_name=bench"),
            url.clone(),
            "PostgreSQL",
        ),
        None => (
            format!(
                "sqlite://{}?queue_name=bench",
                dir.path().join("courier.db").display()
            ),
            format!("sqlite://{}", dir.path().join("symfony.db").display()),
            "SQLite",
        ),
    };
    let courier =
        SqlTransport::connect("courier", &Dsn::parse(&courier_url)?, registry.clone()).await?;
    let symfony = DoctrineTransport::connect(
        "symfony",
        &symfony_url,
        DoctrineOptions::default().table_name(&symfony_table),
        SymfonySerializer::new(SymfonyTypes::new().map(r"App\Message\SendEmail", "mail.send")),
        registry,
    )
    .await?;

    let measured = async {
        // One warm-up round each, then three measured ones in turns.
        run(&courier, n / 10).await?;
        run(&symfony, n / 10).await?;
        let (mut courier_rate, mut symfony_rate) = (0f64, 0f64);
        for _ in 0..3 {
            courier_rate = courier_rate.max(run(&courier, n).await?);
            symfony_rate = symfony_rate.max(run(&symfony, n).await?);
        }
        anyhow::Ok((courier_rate, symfony_rate))
    }
    .await;
    if let Some(url) = &server {
        drop_tables(url, &[&courier_table, &symfony_table]).await?;
    }
    let (courier_rate, symfony_rate) = measured?;
    println!("queue, {database}, {n} messages (send, get, ack in batches of 100; best of 3):");
    println!("  courier format (SqlTransport):     {courier_rate:>10.0} msg/s");
    println!("  symfony format (DoctrineTransport): {symfony_rate:>10.0} msg/s");
    println!(
        "  ratio symfony / courier: {:.2}",
        symfony_rate / courier_rate
    );

    let (c, s) = serializers(n * 10)?;
    println!("serializer alone, encode + decode, {} messages:", n * 10);
    println!("  courier: {c:>10.0} msg/s");
    println!("  symfony: {s:>10.0} msg/s");
    println!("  ratio symfony / courier: {:.2}", s / c);
    Ok(())
}

/// Drops the bench's tables (and whatever else of theirs starts with their names).
#[cfg(feature = "postgres")]
async fn drop_tables(url: &str, tables: &[&str]) -> anyhow::Result<()> {
    let pool = sqlx::PgPool::connect(url).await?;
    for table in tables {
        let owned: Vec<(String,)> =
            sqlx::query_as("SELECT tablename::text FROM pg_tables WHERE tablename LIKE $1 || '%'")
                .bind(table)
                .fetch_all(&pool)
                .await?;
        for (name,) in owned {
            sqlx::query(&format!("DROP TABLE IF EXISTS {name} CASCADE"))
                .execute(&pool)
                .await?;
        }
    }
    Ok(())
}

#[cfg(not(feature = "postgres"))]
async fn drop_tables(_url: &str, _tables: &[&str]) -> anyhow::Result<()> {
    anyhow::bail!("a server database needs the `postgres` feature")
}
