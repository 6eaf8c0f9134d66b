//! The worker's own overhead: consume 20,000 pre-sent messages from the in-memory transport with a
//! no-op handler, fetch_size 1 vs 32.
//!
//! `cargo bench --bench worker`

#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented items"
)]

use std::future::ready;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{
    CancellationToken, Envelope, HandlerError, InMemoryTransport, Message, MessageBus, Transport,
    Worker,
};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde::{Deserialize, Serialize};

const N: u64 = 20_000;

#[derive(Serialize, Deserialize)]
struct Job(u64);

impl Message for Job {
    const NAME: &'static str = "bench.job";
}

fn consume(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let bus = MessageBus::builder()
        .handler_fn("noop", |_: Arc<Job>| ready(Ok::<(), HandlerError>(())))
        .build();
    let mut group = c.benchmark_group("worker/in_memory_20k");
    group.throughput(Throughput::Elements(N));
    group.sample_size(10);
    for fetch_size in [1usize, 32] {
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("fetch_size_{fetch_size}")),
            &fetch_size,
            |b, &fs| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let queue = Arc::new(InMemoryTransport::new());
                            let batch: Vec<Envelope> =
                                (0..N).map(|i| Envelope::new(Job(i))).collect();
                            queue.send_batch(batch).await.expect("send");
                            let worker = Worker::builder(bus.clone())
                                .receiver("bench", queue.clone())
                                .fetch_size(fs)
                                .limit(N)
                                .build();
                            let started = Instant::now();
                            let stats = worker.run(CancellationToken::new()).await.expect("run");
                            total += started.elapsed();
                            assert_eq!(stats.handled, N);
                        }
                        total
                    })
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, consume);
criterion_main!(benches);
