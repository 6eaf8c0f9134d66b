//! Consuming several queues on one channel: the pieces this crate's receiving half is built
//! from, public so that other layouts on RabbitMQ (Symfony's, in `courier-symfony`) receive the
//! same way.

use std::collections::{BTreeSet, VecDeque};

use futures_util::future::FutureExt;
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions};
use lapin::types::{FieldTable, ShortString};
use tokio::time::Instant;

/// A delivery of the queue at an index of the consumed queues, or `(index, None)` once that
/// queue's consumer ended (cancelled, or its channel closed).
pub type Item = (usize, Option<lapin::Result<Delivery>>);

/// The deliveries of every consumed queue, as they come.
pub type Deliveries = SelectAll<BoxStream<'static, Item>>;

/// `basic.consume` on each of `queues` on `channel`: their deliveries, and the consumer tags
/// (one per queue, in order).
///
/// # Errors
/// What failed (`cannot consume queue `name``), and the broker's error.
pub async fn consume_queues(
    channel: &Channel,
    queues: &[&str],
) -> Result<(Deliveries, Vec<ShortString>), (String, lapin::Error)> {
    let mut streams = SelectAll::new();
    let mut tags = Vec::new();
    for (i, &queue) in queues.iter().enumerate() {
        let consumer = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| (format!("cannot consume queue `{queue}`"), e))?;
        tags.push(consumer.tag());
        let s: BoxStream<'static, Item> = consumer
            .map(move |r| (i, Some(r)))
            .chain(stream::once(async move { (i, None) }))
            .boxed();
        streams.push(s);
    }
    Ok((streams, tags))
}

/// A delivery and its queue's index, or `None` when a consumer ended or failed (logged).
#[must_use]
pub fn step(item: Option<Item>) -> Option<(usize, Delivery)> {
    match item {
        Some((i, Some(Ok(d)))) => Some((i, d)),
        Some((_, Some(Err(e)))) => {
            tracing::warn!(error = %e, "amqp consumer failed");
            None
        }
        Some((_, None)) | None => None,
    }
}

/// Cancels the consumers `tags` and moves every delivery they got before the cancel took effect
/// into `buffer`, until each consumer's stream ended or `deadline` passed: afterwards the broker
/// pushes nothing more. Ok(false) when the deadline came first.
///
/// # Errors
/// A refused `basic.cancel`, or a consumer that failed.
pub async fn cancel_consumers(
    channel: &Channel,
    tags: &[ShortString],
    deliveries: &mut Deliveries,
    buffer: &mut VecDeque<(usize, Delivery)>,
    deadline: Instant,
) -> lapin::Result<bool> {
    for tag in tags {
        channel
            .basic_cancel(tag.clone(), BasicCancelOptions::default())
            .await?;
    }
    let mut ended = 0;
    while ended < tags.len() {
        match tokio::time::timeout_at(deadline, deliveries.next()).await {
            Ok(Some((i, Some(Ok(d))))) => buffer.push_back((i, d)),
            Ok(Some((_, None))) => ended += 1,
            Ok(None) => break,
            Ok(Some((_, Some(Err(e))))) => return Err(e),
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// The last tag of the longest run from `floor + 1` made of the tags `mine` (to ack) and tags
/// `settled` already (every tag up to `floor` is): a `basic.ack(multiple)` up to it acks `mine`
/// up to there and nothing else. None when the run holds none of `mine`.
#[must_use]
pub fn multiple_ack_to(floor: u64, settled: &BTreeSet<u64>, mine: &BTreeSet<u64>) -> Option<u64> {
    let mut last = None;
    let mut tag = floor + 1;
    loop {
        if mine.contains(&tag) {
            last = Some(tag);
        } else if !settled.contains(&tag) {
            return last;
        }
        tag += 1;
    }
}

/// Queues a settle frame (`basic.ack`, `basic.reject`, `basic.nack`) on its channel without
/// waiting for lapin's I/O thread to write it: the broker confirms no settle, so the write is
/// all there is to wait for, and a consumer under a prefetch of 1 would wait twice per message
/// (the write, then the next delivery) instead of once. Frames leave in the order they were
/// queued; one the connection drops before writing it is lost like one written just before,
/// and the broker delivers its message again. A channel already closed fails here, at once.
///
/// # Errors
/// The channel's error, when it is closed.
pub fn queued(settle: impl std::future::Future<Output = lapin::Result<()>>) -> lapin::Result<()> {
    // lapin queues the frame in the first poll and then waits on a promise of the write;
    // dropping that promise leaves the frame queued.
    settle.now_or_never().unwrap_or(Ok(()))
}
