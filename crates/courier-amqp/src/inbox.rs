//! The receiving half: one consuming channel (`basic.qos(prefetch)` + one `basic.consume` per
//! queue), the deliveries the broker pushed, and the bookkeeping that makes acks safe.
//!
//! Delivery tags are per channel and restart at 1 on a new channel, so every delivery is tagged
//! `<generation>.<tag>` where the generation names the consuming channel. An ack or reject for
//! an older generation, or for a tag already settled, is a no-op: the broker has already put
//! that delivery back (the channel died) or removed it, and acking a tag twice would make the
//! broker close the channel.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use courier_core::TransportError;
use futures_util::future::FutureExt;
use futures_util::stream::{self, BoxStream, SelectAll, StreamExt};
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use tokio::time::Instant;

use crate::link::{Link, amqp_error};

type Item = (usize, Option<lapin::Result<Delivery>>);

struct Feed {
    generation: u64,
    channel: Channel,
    stream: SelectAll<BoxStream<'static, Item>>,
    /// Deliveries pulled off the stream by `message_count` but not yet handed out.
    buffer: VecDeque<(usize, Delivery)>,
}

#[derive(Default)]
struct Live {
    generation: u64,
    channel: Option<Channel>,
    /// Tags handed out by `get` and not yet settled.
    outstanding: HashSet<u64>,
    /// Every tag <= floor is settled.
    floor: u64,
    /// Settled tags above the floor.
    settled: BTreeSet<u64>,
}

impl Live {
    fn settle(&mut self, tag: u64) {
        self.settled.insert(tag);
        while self.settled.remove(&(self.floor + 1)) {
            self.floor += 1;
        }
    }
}

/// A delivery handed out by [`Inbox::get`].
pub(crate) struct Received {
    pub(crate) queue: usize,
    pub(crate) generation: u64,
    pub(crate) delivery: Delivery,
}

#[derive(Default)]
pub(crate) struct Inbox {
    feed: tokio::sync::Mutex<Option<Feed>>,
    live: tokio::sync::Mutex<Live>,
}

enum Step {
    Got(usize, Delivery),
    Broken,
}

fn step(item: Option<Item>) -> Step {
    match item {
        Some((i, Some(Ok(d)))) => Step::Got(i, d),
        Some((_, Some(Err(e)))) => {
            tracing::warn!(error = %e, "amqp consumer failed");
            Step::Broken
        }
        Some((_, None)) | None => Step::Broken,
    }
}

impl Inbox {
    async fn open(&self, link: &Link) -> Result<Feed, TransportError> {
        let name = link.name();
        let session = link.session().await?;
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(name, "cannot open the consuming channel", e))?;
        let opened = async {
            channel
                .basic_qos(link.options.prefetch, BasicQosOptions::default())
                .await
                .map_err(|e| amqp_error(name, "basic.qos failed", e))?;
            let mut streams = SelectAll::new();
            for (i, q) in link.options.queues.iter().enumerate() {
                let consumer = channel
                    .basic_consume(
                        q.name.as_str().into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| {
                        amqp_error(
                            name,
                            format!("cannot consume queue `{}`", q.name).as_str(),
                            e,
                        )
                    })?;
                let s: BoxStream<'static, Item> = consumer
                    .map(move |r| (i, Some(r)))
                    .chain(stream::once(async move { (i, None) }))
                    .boxed();
                streams.push(s);
            }
            Ok::<_, TransportError>(streams)
        };
        let streams = match opened.await {
            Ok(s) => s,
            Err(e) => {
                let _ = channel.close(200, "consume failed".into()).await;
                link.invalidate().await;
                return Err(e);
            }
        };
        let mut live = self.live.lock().await;
        let generation = live.generation + 1;
        *live = Live {
            generation,
            channel: Some(channel.clone()),
            ..Live::default()
        };
        Ok(Feed {
            generation,
            channel,
            stream: streams,
            buffer: VecDeque::new(),
        })
    }

    async fn forget(&self, feed: &mut Option<Feed>, close: bool) {
        if let Some(f) = feed.take() {
            {
                let mut live = self.live.lock().await;
                if live.generation == f.generation {
                    live.channel = None;
                    live.outstanding.clear();
                }
            }
            if close {
                let _ = f.channel.close(200, "consumer closed".into()).await;
            }
        }
    }

    /// Up to `max` deliveries: what the broker already pushed, else waits up to `window` for the
    /// first. Reopens the consuming channel (reconnecting if needed) when it died.
    pub(crate) async fn get(
        &self,
        link: &Link,
        max: usize,
        window: Duration,
    ) -> Result<Vec<Received>, TransportError> {
        let deadline = Instant::now() + window;
        let mut guard = self.feed.lock().await;
        let mut out: Vec<(usize, Delivery)> = Vec::new();
        loop {
            if guard.is_none() {
                match self.open(link).await {
                    Ok(f) => *guard = Some(f),
                    Err(e) => {
                        let now = Instant::now();
                        if now >= deadline {
                            return Err(e);
                        }
                        let wait = link
                            .backoff_remaining()
                            .await
                            .max(Duration::from_millis(50));
                        tokio::time::sleep(wait.min(deadline - now)).await;
                        continue;
                    }
                }
            }
            let Some(feed) = guard.as_mut() else { continue };
            while out.len() < max {
                match feed.buffer.pop_front() {
                    Some(d) => out.push(d),
                    None => break,
                }
            }
            let mut broken = false;
            while out.len() < max {
                match feed.stream.next().now_or_never() {
                    None => break,
                    Some(item) => match step(item) {
                        Step::Got(i, d) => out.push((i, d)),
                        Step::Broken => {
                            broken = true;
                            break;
                        }
                    },
                }
            }
            if !broken && out.is_empty() && max > 0 {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(Vec::new());
                }
                match tokio::time::timeout(deadline - now, feed.stream.next()).await {
                    Err(_) => return Ok(Vec::new()),
                    Ok(item) => match step(item) {
                        Step::Got(i, d) => {
                            out.push((i, d));
                            continue; // drain what else is ready
                        }
                        Step::Broken => broken = true,
                    },
                }
            }
            let generation = feed.generation;
            if broken {
                self.forget(&mut guard, false).await;
                link.invalidate().await;
                if out.is_empty() {
                    continue;
                }
                // These deliveries died with their channel; the broker redelivers them.
                return Ok(Vec::new());
            }
            let mut live = self.live.lock().await;
            let current = live.generation == generation;
            let received = out
                .into_iter()
                .map(|(queue, delivery)| {
                    if current {
                        live.outstanding.insert(delivery.delivery_tag);
                    }
                    Received {
                        queue,
                        generation,
                        delivery,
                    }
                })
                .collect();
            return Ok(received);
        }
    }

    /// Acks (or rejects) deliveries `(generation, tag)`; stale or settled ones are skipped.
    /// Acks use `basic.ack(multiple)` for the longest run that covers exactly the given tags.
    pub(crate) async fn settle(
        &self,
        link: &Link,
        tags: &[(u64, u64)],
        ack: bool,
    ) -> Result<(), TransportError> {
        let name = link.name();
        let mut live = self.live.lock().await;
        let Some(channel) = live.channel.clone() else {
            return Ok(());
        };
        let generation = live.generation;
        let mut mine = BTreeSet::new();
        for &(g, tag) in tags {
            if g == generation && live.outstanding.remove(&tag) {
                mine.insert(tag);
            }
        }
        if mine.is_empty() {
            return Ok(());
        }
        let mut multi_to = None;
        if ack && mine.len() > 1 {
            let mut x = live.floor + 1;
            loop {
                if mine.contains(&x) {
                    multi_to = Some(x);
                } else if !live.settled.contains(&x) {
                    break;
                }
                x += 1;
            }
        }
        for &tag in &mine {
            live.settle(tag);
        }
        let result = async {
            let mut rest: Vec<u64> = mine.iter().copied().collect();
            if let Some(t) = multi_to {
                let covered = mine.range(..=t).count();
                if covered > 1 {
                    channel
                        .basic_ack(t, BasicAckOptions { multiple: true })
                        .await
                        .map_err(|e| amqp_error(name, "basic.ack failed", e))?;
                    rest.retain(|&x| x > t);
                }
            }
            for tag in rest {
                if ack {
                    channel.basic_ack(tag, BasicAckOptions::default()).await
                } else {
                    channel
                        .basic_reject(tag, BasicRejectOptions { requeue: false })
                        .await
                }
                .map_err(|e| {
                    amqp_error(
                        name,
                        if ack {
                            "basic.ack failed"
                        } else {
                            "basic.reject failed"
                        },
                        e,
                    )
                })?;
            }
            Ok(())
        }
        .await;
        drop(live);
        result
    }

    /// Closes the consuming channel without acking: the broker requeues every unacked delivery.
    pub(crate) async fn close(&self) {
        let mut guard = self.feed.lock().await;
        self.forget(&mut guard, true).await;
    }

    /// Ready messages (passive declare) plus those delivered to this consumer and not settled.
    pub(crate) async fn message_count(&self, link: &Link) -> Result<u64, TransportError> {
        let name = link.name();
        let mut guard = self.feed.lock().await;
        let existing = guard
            .as_ref()
            .map(|f| f.channel.clone())
            .filter(|c| c.status().connected());
        let (channel, temporary) = match existing {
            Some(c) => (c, false),
            None => {
                let session = link.session().await?;
                let ch = session
                    .connection
                    .create_channel()
                    .await
                    .map_err(|e| amqp_error(name, "cannot open a channel", e))?;
                (ch, true)
            }
        };
        let mut total: u64 = 0;
        for q in &link.options.queues {
            let declared = channel
                .queue_declare(
                    q.name.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(info) => total += u64::from(info.message_count()),
                Err(e) => {
                    if temporary {
                        let _ = channel.close(200, "count done".into()).await;
                    } else {
                        self.forget(&mut guard, false).await;
                    }
                    return Err(amqp_error(
                        name,
                        format!("cannot count queue `{}`", q.name).as_str(),
                        e,
                    ));
                }
            }
        }
        if temporary {
            let _ = channel.close(200, "count done".into()).await;
        }
        let mut broken = false;
        if let Some(feed) = guard.as_mut() {
            while let Some(item) = feed.stream.next().now_or_never() {
                match step(item) {
                    Step::Got(i, d) => feed.buffer.push_back((i, d)),
                    Step::Broken => {
                        broken = true;
                        break;
                    }
                }
            }
            total += feed.buffer.len() as u64;
        }
        if broken {
            self.forget(&mut guard, false).await;
        } else {
            total += self.live.lock().await.outstanding.len() as u64;
        }
        Ok(total)
    }
}
