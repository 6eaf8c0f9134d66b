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

use courier_core::{TransportError, TransportErrorKind};
use futures_util::future::FutureExt;
use futures_util::stream::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicQosOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use tokio::time::Instant;

use crate::consume::{Deliveries, cancel_consumers, consume_queues, multiple_ack_to, queued, step};
use crate::link::{Link, amqp_error};

struct Feed {
    generation: u64,
    channel: Channel,
    /// The consumer tags, one per queue.
    tags: Vec<ShortString>,
    stream: Deliveries,
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
    /// Settled tags above the floor (their frames were sent).
    settled: BTreeSet<u64>,
    /// Tags whose settle frames are being sent.
    sending: HashSet<u64>,
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
    live: std::sync::Mutex<Live>,
}

type Streams = (Deliveries, Vec<ShortString>);

/// `basic.consume` on every queue of the transport; each stream ends with a `(queue, None)`
/// marker when its consumer is cancelled.
async fn consume_all(link: &Link, channel: &Channel) -> Result<Streams, TransportError> {
    consume_queues(channel, &link.options.queue_names())
        .await
        .map_err(|(doing, e)| amqp_error(link.name(), &doing, e))
}

/// Cancels the consumers and moves every delivery they got into the buffer: afterwards the
/// broker pushes nothing more, so ready counts and local counts do not overlap.
async fn quiesce(link: &Link, feed: &mut Feed) -> Result<(), TransportError> {
    let name = link.name();
    let deadline = Instant::now() + link.options.confirm_timeout;
    let ended = cancel_consumers(
        &feed.channel,
        &feed.tags,
        &mut feed.stream,
        &mut feed.buffer,
        deadline,
    )
    .await
    .map_err(|e| amqp_error(name, "basic.cancel failed", e))?;
    if ended {
        Ok(())
    } else {
        Err(
            TransportError::new(TransportErrorKind::Timeout, name.to_owned())
                .with_context("consumer cancel did not complete"),
        )
    }
}

impl Inbox {
    fn lock_live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens the consuming channel; with `auto_setup`, a refused `basic.consume` (a queue was
    /// deleted under us) re-declares the topology and tries once more.
    async fn open(&self, link: &Link) -> Result<Feed, TransportError> {
        match self.open_once(link).await {
            Err(e) if link.options.auto_setup => {
                tracing::debug!(error = %e, "amqp consume failed; re-declaring the topology");
                let session = link.session().await?;
                link.declare(&session).await?;
                self.open_once(link).await
            }
            other => other,
        }
    }

    async fn open_once(&self, link: &Link) -> Result<Feed, TransportError> {
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
            consume_all(link, &channel).await
        };
        let (streams, tags) = match opened.await {
            Ok(s) => s,
            Err(e) => {
                let _ = channel.close(200, "consume failed".into()).await;
                link.invalidate().await;
                return Err(e);
            }
        };
        let mut live = self.lock_live();
        let generation = live.generation + 1;
        *live = Live {
            generation,
            channel: Some(channel.clone()),
            ..Live::default()
        };
        Ok(Feed {
            generation,
            channel,
            tags,
            stream: streams,
            buffer: VecDeque::new(),
        })
    }

    async fn forget(&self, feed: &mut Option<Feed>, close: bool) {
        if let Some(f) = feed.take() {
            {
                let mut live = self.lock_live();
                if live.generation == f.generation {
                    live.channel = None;
                    live.outstanding.clear();
                }
            }
            if close && f.channel.status().connected() {
                let closing = f.channel.close(200, "consumer closed".into());
                let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
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
            let mut yielded = false;
            while out.len() < max {
                match feed.stream.next().now_or_never() {
                    // Deliveries arrive in bursts from lapin's I/O task: give it one turn
                    // before settling for a partial batch.
                    None if !yielded && !out.is_empty() => {
                        yielded = true;
                        // Cancel safety: park what we hold in the buffer across the await, so a
                        // dropped `get` (a worker shutting down) loses no delivery.
                        for d in out.drain(..).rev() {
                            feed.buffer.push_front(d);
                        }
                        tokio::task::yield_now().await;
                        while out.len() < max {
                            match feed.buffer.pop_front() {
                                Some(d) => out.push(d),
                                None => break,
                            }
                        }
                    }
                    None => break,
                    Some(item) => match step(item) {
                        Some((i, d)) => out.push((i, d)),
                        None => {
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
                        Some((i, d)) => {
                            out.push((i, d));
                            continue; // drain what else is ready
                        }
                        None => broken = true,
                    },
                }
            }
            let generation = feed.generation;
            if broken {
                // Close what is left of the channel so its unacked deliveries are requeued.
                self.forget(&mut guard, true).await;
                link.invalidate().await;
                if out.is_empty() {
                    continue;
                }
                // These deliveries died with their channel; the broker redelivers them.
                return Ok(Vec::new());
            }
            let mut live = self.lock_live();
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
    /// Returns once the frames are queued on the channel, in order (see [`queued`]).
    pub(crate) async fn settle(
        &self,
        link: &Link,
        tags: &[(u64, u64)],
        ack: bool,
    ) -> Result<(), TransportError> {
        let name = link.name();
        // Plan under the lock, send without it: the worker's ack task and its handlers' retries
        // and rejects settle at the same time, and a frame in flight must not hold up the others.
        let (channel, generation, mine, multi_to) = {
            let mut live = self.lock_live();
            let Some(channel) = live.channel.clone() else {
                return Ok(());
            };
            if !channel.status().connected() {
                // The channel died: the broker has requeued its deliveries and will deliver
                // them again, so there is nothing left to settle.
                tracing::debug!(messaging.destination.name = %name, "amqp channel closed; deliveries already requeued");
                live.channel = None;
                live.outstanding.clear();
                return Ok(());
            }
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
            // The longest run from the floor made of our tags and tags whose settle frame was
            // already sent; a tag still being settled by another call breaks the run, so a
            // multiple ack never overtakes its single ack.
            let multi_to = if ack && mine.len() > 1 {
                multiple_ack_to(live.floor, &live.settled, &mine)
            } else {
                None
            };
            live.sending.extend(mine.iter().copied());
            (channel, generation, mine, multi_to)
        };
        let result = (|| {
            let mut rest: Vec<u64> = mine.iter().copied().collect();
            if let Some(t) = multi_to
                && mine.range(..=t).count() > 1
            {
                queued(channel.basic_ack(t, BasicAckOptions { multiple: true }))
                    .map_err(|e| amqp_error(name, "basic.ack failed", e))?;
                rest.retain(|&x| x > t);
            }
            for tag in rest {
                if ack {
                    queued(channel.basic_ack(tag, BasicAckOptions::default()))
                } else {
                    queued(channel.basic_reject(tag, BasicRejectOptions { requeue: false }))
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
        })();
        let mut live = self.lock_live();
        if live.generation == generation {
            for tag in &mine {
                live.sending.remove(tag);
                live.settle(*tag);
            }
            if result.is_err() {
                // The frame could not be sent: the channel is gone and its deliveries come back.
                live.channel = None;
                live.outstanding.clear();
            }
        }
        result
    }

    /// Closes the consuming channel without acking: the broker requeues every unacked delivery.
    pub(crate) async fn close(&self) {
        let mut guard = self.feed.lock().await;
        self.forget(&mut guard, true).await;
    }

    /// Ready messages (passive declares on the queues and on the delay bucket queues this
    /// process declared) plus those delivered to this consumer and not settled. The consumers
    /// are paused (cancelled, then consumed again) while counting so nothing is counted twice.
    pub(crate) async fn message_count(&self, link: &Link) -> Result<u64, TransportError> {
        let name = link.name();
        let mut guard = self.feed.lock().await;
        if let Some(feed) = guard.as_mut()
            && let Err(e) = quiesce(link, feed).await
        {
            tracing::warn!(error = %e, "amqp consumer lost while counting");
            self.forget(&mut guard, true).await;
        }
        let session = link.session().await?;
        let channel = session
            .connection
            .create_channel()
            .await
            .map_err(|e| amqp_error(name, "cannot open a channel", e))?;
        let mut queues: Vec<String> = link.options.queues.iter().map(|q| q.name.clone()).collect();
        queues.extend(link.known_delay_queues());
        let mut total: u64 = 0;
        for q in &queues {
            let declared = channel
                .queue_declare(
                    q.as_str().into(),
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
                    return Err(amqp_error(
                        name,
                        format!("cannot count queue `{q}`").as_str(),
                        e,
                    ));
                }
            }
        }
        let _ = channel.close(200, "count done".into()).await;
        if let Some(feed) = guard.as_mut() {
            total += feed.buffer.len() as u64;
            match consume_all(link, &feed.channel).await {
                Ok((stream, tags)) => {
                    feed.stream = stream;
                    feed.tags = tags;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "amqp consumer lost while counting");
                    self.forget(&mut guard, true).await;
                }
            }
        }
        total += self.lock_live().outstanding.len() as u64;
        Ok(total)
    }
}
