//! JSON against MessagePack bodies: encode + decode of a typical ~200-byte message and a
//! ~10 KiB one, through Courier's codec (`encode_json_with` + `decode_json`, what the SQL and
//! Redis transports run), and the body sizes, printed before the timings.
//!
//! `cargo bench --bench serializer`

#![allow(
    missing_docs,
    reason = "criterion's macros generate undocumented items"
)]

use std::hint::black_box;

use courier::{Envelope, Message, MessageRegistry, Serializer, encode_json_with};
use criterion::{Criterion, criterion_group, criterion_main};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
    unit_cents: u64,
}

#[derive(Clone, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
    customer: String,
    email: String,
    currency: String,
    total_cents: u64,
    placed_at: u64,
    lines: Vec<Line>,
}

impl Message for OrderPlaced {
    const NAME: &'static str = "orders.placed";
}

fn order(lines: usize) -> OrderPlaced {
    OrderPlaced {
        order_id: 9_876_543_210,
        customer: "Ada Lovelace".into(),
        email: "ada@example.com".into(),
        currency: "EUR".into(),
        total_cents: 129_990,
        placed_at: 1_764_576_000_000,
        lines: (0..lines)
            .map(|i| Line {
                sku: format!("SKU-{i:06}"),
                quantity: 1 + (i as u32 % 5),
                unit_cents: 1_999 + i as u64,
            })
            .collect(),
    }
}

fn sizes(name: &str, message: &OrderPlaced) {
    let json = serde_json::to_vec(message).expect("json");
    let packed = rmp_serde::to_vec_named(message).expect("msgpack");
    let wire =
        encode_json_with(&Envelope::new(message.clone()), Serializer::MessagePack).expect("encode");
    println!(
        "{name}: json body {} B, msgpack {} B ({:.0} %), msgpack as stored (base64) {} B ({:.0} %)",
        json.len(),
        packed.len(),
        100.0 * packed.len() as f64 / json.len() as f64,
        wire.body.len(),
        100.0 * wire.body.len() as f64 / json.len() as f64,
    );
}

fn round_trips(c: &mut Criterion) {
    let registry = MessageRegistry::new().with::<OrderPlaced>();
    // 1 line: a ~200-byte JSON body; 190 lines: ~10 KiB.
    for (name, message) in [("200B", order(1)), ("10KiB", order(190))] {
        sizes(name, &message);
        for serializer in [Serializer::Json, Serializer::MessagePack] {
            let envelope = Envelope::new(message.clone());
            c.bench_function(
                &format!("serializer/{name}/{serializer}/encode+decode"),
                |b| {
                    b.iter(|| {
                        let wire =
                            encode_json_with(black_box(&envelope), serializer).expect("encode");
                        let back = registry.decode_json(wire.body, &wire.headers);
                        black_box(back.message::<OrderPlaced>().map(|m| m.order_id))
                    });
                },
            );
        }
        // The serializers alone, without Courier's envelope, headers and base64.
        c.bench_function(&format!("serializer/{name}/serde_json-alone"), |b| {
            b.iter(|| {
                let bytes = serde_json::to_vec(black_box(&message)).expect("json");
                black_box(serde_json::from_slice::<OrderPlaced>(&bytes).map(|m| m.order_id))
            });
        });
        c.bench_function(&format!("serializer/{name}/rmp_serde-alone"), |b| {
            b.iter(|| {
                let bytes = rmp_serde::to_vec_named(black_box(&message)).expect("msgpack");
                black_box(rmp_serde::from_slice::<OrderPlaced>(&bytes).map(|m| m.order_id))
            });
        });
    }
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
