//! Throughput, raw lapin against `AmqpTransport`, same N, size and ack pattern, one process:
//! one-at-a-time (publish + confirm each; prefetch 1, ack each) and batched by 64 (publish 64
//! then await their confirms; prefetch 64, one `basic.ack(multiple)` per 64).
//!
//! `cargo test -p courier-amqp --release --test throughput -- --include-ignored --nocapture`

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use std::time::{Duration, Instant};

use common::AmqpHarness;
use courier_amqp::{AmqpOptions, QueueOptions};
use courier_core::{Envelope, Transport};
use courier_test::TestMessage;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// Messages per run: fewer one at a time (each waits for an fsync'd confirm).
fn n_for(batch: usize) -> usize {
    if batch == 1 { 500 } else { 6400 }
}

fn body() -> String {
    "x".repeat(160)
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// (produce/s, consume+ack/s) with raw lapin.
async fn raw(url: &str, batch: usize) -> (f64, f64) {
    let n_total = n_for(batch);
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let q = AmqpHarness::unique("courier_amqp_raw");
    // The queue is deleted when the run ends, pass or fail.
    let cleanup = courier_test::Cleanup::new();
    let (amqp_url, queue) = (url.to_owned(), q.clone());
    cleanup.defer(format!("the AMQP queue {q}"), async move {
        let conn = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
        let ch = conn.create_channel().await?;
        ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        conn.close(200, "done".into()).await
    });
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let payload = format!(r#"{{"seq":1,"text":"{}"}}"#, body());
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    let start = Instant::now();
    for chunk in (0..n_total).collect::<Vec<_>>().chunks(batch) {
        let mut confirms = Vec::new();
        for _ in chunk {
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    payload.as_bytes(),
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
    let produce = rate(n_total, start.elapsed());
    let cch = conn.create_channel().await.unwrap();
    cch.basic_qos(u16::try_from(batch).unwrap(), BasicQosOptions::default())
        .await
        .unwrap();
    let start = Instant::now();
    let mut consumer = cch
        .basic_consume(
            q.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut n = 0;
    while n < n_total {
        let d = consumer.next().await.unwrap().unwrap();
        n += 1;
        if n % batch == 0 || n == n_total {
            cch.basic_ack(
                d.delivery_tag,
                BasicAckOptions {
                    multiple: batch > 1,
                },
            )
            .await
            .unwrap();
        }
    }
    let consume = rate(n_total, start.elapsed());
    let _ = conn.close(200, "done".into()).await;
    (produce, consume)
}

/// (produce/s, consume+ack/s) through `AmqpTransport`.
async fn courier(h: &AmqpHarness, batch: usize) -> (f64, f64) {
    let n_total = n_for(batch);
    let name = AmqpHarness::unique("courier_amqp_tp");
    let options = AmqpOptions::new(&name)
        .queues([QueueOptions::new(&name)])
        .prefetch(u16::try_from(batch).unwrap())
        .poll_window(Duration::from_millis(200));
    let t = h.make(options).await;
    let text = body();
    let start = Instant::now();
    for chunk in (0..n_total as u64).collect::<Vec<_>>().chunks(batch) {
        let envelopes: Vec<Envelope> = chunk
            .iter()
            .map(|&s| {
                Envelope::new(TestMessage {
                    seq: s,
                    text: text.clone(),
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
    let produce = rate(n_total, start.elapsed());
    let start = Instant::now();
    let mut n = 0;
    while n < n_total {
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
    let consume = rate(n_total, start.elapsed());
    (produce, consume)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs rabbitmq: set COURIER_TEST_AMQP_URL"]
async fn throughput_raw_lapin_vs_transport() {
    let h = AmqpHarness::new();
    for batch in [1usize, 64] {
        let (mut rp, mut rc, mut cp, mut cc) = (vec![], vec![], vec![], vec![]);
        for _ in 0..3 {
            let (p, c) = raw(&h.url, batch).await;
            rp.push(p);
            rc.push(c);
            let (p, c) = courier(&h, batch).await;
            cp.push(p);
            cc.push(c);
        }
        let (rp, rc, cp, cc) = (median(rp), median(rc), median(cp), median(cc));
        eprintln!(
            "N={} batch/prefetch {batch:>2} (median of 3, interleaved): raw produce {rp:>7.0}/s consume+ack \
             {rc:>7.0}/s | courier produce {cp:>7.0}/s consume+ack {cc:>7.0}/s | ratio produce {:.2} consume {:.2}",
            n_for(batch),
            cp / rp,
            cc / rc
        );
    }
}
