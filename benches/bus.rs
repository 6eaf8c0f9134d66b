//! Dispatch through the full default middleware stack to one in-process handler.
//!
//! `cargo bench --bench bus`

#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented items"
)]

use std::future::ready;
use std::sync::Arc;

use courier::{HandlerError, Message, MessageBus};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Ping(u64);

impl Message for Ping {
    const NAME: &'static str = "bench.ping";
}

fn dispatch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let bus = MessageBus::builder()
        .handler_fn("noop", |_: Arc<Ping>| ready(Ok::<(), HandlerError>(())))
        .build();
    c.bench_function("bus/dispatch_to_one_sync_handler", |b| {
        b.to_async(&rt)
            .iter(|| async { bus.dispatch(Ping(1)).await.expect("dispatch") });
    });
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
