//! Raw lapin against `AmqpTransport`, same N, message size and protocol work, in one process:
//! publish with confirms (one at a time for prefetch 1, 64 in flight for prefetch 64), then
//! consume with `basic.qos(prefetch)` and ack (each, or one `basic.ack(multiple)` per 64).
//!
//! `COURIER_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f cargo bench -p courier-amqp --bench amqp`

#![allow(clippy::unwrap_used, missing_docs, reason = "bench")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_amqp::{AmqpOptions, AmqpTransport, QueueOptions};
use courier_core::{Envelope, Message, MessageRegistry, Transport};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};

const N: usize = 256;

#[derive(Serialize, Deserialize)]
struct Payload {
    seq: u64,
    text: String,
}

impl Message for Payload {
    const NAME: &'static str = "bench.payload";
}

fn text() -> String {
    "x".repeat(160)
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

struct Raw {
    publisher: Channel,
    consumer: Channel,
    queue: String,
    conn: Connection,
}

async fn raw_setup(url: &str, prefetch: u16) -> Raw {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let publisher = conn.create_channel().await.unwrap();
    let queue = unique("courier_bench_raw");
    publisher
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let consumer = conn.create_channel().await.unwrap();
    consumer
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    Raw {
        publisher,
        consumer,
        queue,
        conn,
    }
}

async fn raw_round(r: &Raw, batch: usize) {
    let body = serde_json::to_vec(&Payload {
        seq: 1,
        text: text(),
    })
    .unwrap();
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    for _ in 0..N / batch {
        let mut confirms = Vec::with_capacity(batch);
        for _ in 0..batch {
            confirms.push(
                r.publisher
                    .basic_publish(
                        "".into(),
                        r.queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &body,
                        props.clone(),
                    )
                    .await
                    .unwrap(),
            );
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
    }
    let mut consumer = r
        .consumer
        .basic_consume(
            r.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for n in 1..=N {
        let d = consumer.next().await.unwrap().unwrap();
        let _: Payload = serde_json::from_slice(&d.data).unwrap();
        if n % batch == 0 {
            r.consumer
                .basic_ack(
                    d.delivery_tag,
                    BasicAckOptions {
                        multiple: batch > 1,
                    },
                )
                .await
                .unwrap();
        }
    }
    r.consumer
        .basic_cancel(consumer.tag(), Default::default())
        .await
        .unwrap();
}

async fn courier_round(t: &AmqpTransport, batch: usize) {
    for chunk in 0..N / batch {
        let envelopes: Vec<Envelope> = (0..batch)
            .map(|i| {
                Envelope::new(Payload {
                    seq: (chunk * batch + i) as u64,
                    text: text(),
                })
            })
            .collect();
        if batch == 1 {
            for e in envelopes {
                t.send(e).await.unwrap();
            }
        } else {
            t.send_batch(envelopes).await.unwrap();
        }
    }
    let mut n = 0;
    while n < N {
        let got = t.get(batch).await.unwrap();
        n += got.len();
        if batch == 1 {
            for e in &got {
                t.ack(e).await.unwrap();
            }
        } else {
            t.ack_batch(&got).await.unwrap();
        }
    }
}

fn bench(c: &mut Criterion) {
    let Ok(url) = std::env::var("COURIER_TEST_AMQP_URL") else {
        eprintln!("skipping the amqp bench: set COURIER_TEST_AMQP_URL (see scripts/services)");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for prefetch in [1u16, 64] {
        let batch = usize::from(prefetch);
        let mut group = c.benchmark_group(format!("amqp_prefetch_{prefetch}"));
        group
            .throughput(Throughput::Elements(N as u64))
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(if prefetch == 1 { 20 } else { 8 }));

        let raw = rt.block_on(raw_setup(&url, prefetch));
        group.bench_function("raw_lapin", |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let raw = &raw;
                async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        raw_round(raw, batch).await;
                    }
                    start.elapsed()
                }
            });
        });
        rt.block_on(async {
            raw.publisher
                .queue_delete(raw.queue.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
            let _ = raw.conn.close(200, "done".into()).await;
        });

        let name = unique("courier_bench");
        let options = AmqpOptions::new(&name)
            .queues([QueueOptions::new(&name)])
            .prefetch(prefetch)
            .poll_window(Duration::from_millis(200));
        let registry = Arc::new(MessageRegistry::new().with::<Payload>());
        let transport = AmqpTransport::new(name, url.clone(), options, registry);
        rt.block_on(transport.abilities().setup.unwrap().setup())
            .unwrap();
        group.bench_function("courier", |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let t = &transport;
                async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        courier_round(t, batch).await;
                    }
                    start.elapsed()
                }
            });
        });
        rt.block_on(transport.delete_topology()).unwrap();
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
