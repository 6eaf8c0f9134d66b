//! Consumer mode (`prefetch_count=N`): the broker pushes deliveries to one `basic.consume` per
//! queue, at most N unacked on the channel, where PHP's receiver asks for each message with a
//! `basic.get`. A `get` takes what was pushed, or waits for the first delivery up to its
//! window, without holding the session (sends, acks and counts go on meanwhile).
//!
//! A consumer holds what the broker pushed it until it is acked. So that a transport nobody
//! asks any more (its worker stopped, the application still running) does not keep those
//! messages from PHP's workers, a consumer that no `get` asked for [`IDLE`] cancels itself and
//! gives back (requeues) what it holds but has not handed out; the next `get` starts another.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use courier_amqp::consume::{Deliveries, cancel_consumers, consume_queues, step};
use courier_core::TransportError;
use futures_util::future::FutureExt;
use futures_util::stream::StreamExt;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicNackOptions, BasicQosOptions};
use lapin::types::ShortString;
use tokio::time::Instant;

use super::link::{Link, Session, amqp_error};
use super::pending::Pending;

/// How long a consumer keeps what the broker pushed it while no `get` asks (see the module).
pub(super) const IDLE: Duration = Duration::from_secs(5);

struct Feed {
    /// The session whose receiving channel this consumes on (its delivery tags).
    generation: u64,
    channel: Channel,
    /// The consumer tags, one per queue.
    tags: Vec<ShortString>,
    stream: Deliveries,
    /// Deliveries taken off the stream and not handed out (a `get` dropped while it waited).
    buffer: VecDeque<(usize, Delivery)>,
    /// When the last `get` returned.
    last_get: Instant,
}

/// Deliveries handed out by [`Consumer::get`]: the session generation they belong to and, for
/// each, the index of its queue.
pub(super) struct Received {
    pub(super) generation: u64,
    pub(super) deliveries: Vec<(usize, Delivery)>,
}

/// The consuming half of a transport in consumer mode.
pub(super) struct Consumer {
    feed: Arc<tokio::sync::Mutex<Option<Feed>>>,
    /// The transport's deliveries: what is given back is settled there.
    pending: Arc<std::sync::Mutex<Pending>>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer").finish_non_exhaustive()
    }
}

impl Consumer {
    pub(super) fn new(pending: Arc<std::sync::Mutex<Pending>>) -> Self {
        Self {
            feed: Arc::default(),
            pending,
        }
    }

    /// Up to `max` deliveries: what the broker already pushed, else the first one to come
    /// within `window` (none: an empty batch). Starts the consumers when there are none (the
    /// first `get`, after [`IDLE`], or after their channel closed).
    pub(super) async fn get(
        &self,
        link: &Link,
        prefetch: u16,
        max: usize,
        window: Duration,
    ) -> Result<Received, TransportError> {
        let deadline = Instant::now() + window;
        let mut guard = self.feed.lock().await;
        loop {
            if guard
                .as_ref()
                .is_none_or(|f| !f.channel.status().connected())
            {
                *guard = None;
                *guard = Some(self.open(link, prefetch).await?);
            }
            let Some(feed) = guard.as_mut() else {
                continue;
            };
            let mut out = Vec::new();
            let broken = feed.take(&mut out, max, deadline).await;
            let generation = feed.generation;
            let connected = feed.channel.status().connected();
            feed.last_get = Instant::now();
            if broken {
                // A consumer ended: start again at the next turn. Deliveries of a channel that
                // closed are the broker's again (it requeued them); ones of a live channel are
                // still ours to settle.
                *guard = None;
                if !connected {
                    out.clear();
                }
                if out.is_empty() && Instant::now() < deadline {
                    continue;
                }
            }
            return Ok(Received {
                generation,
                deliveries: out,
            });
        }
    }

    /// `basic.qos` (`prefetch` for the whole channel) and one `basic.consume` per queue, on the
    /// session's receiving channel, where acks go.
    async fn open(&self, link: &Link, prefetch: u16) -> Result<Feed, TransportError> {
        let name = link.name();
        let (channel, generation) = link
            .with(async |s: &mut Session| Ok((s.getter.clone(), s.generation)))
            .await?;
        channel
            .basic_qos(prefetch, BasicQosOptions { global: true })
            .await
            .map_err(|e| amqp_error(name, "basic.qos failed", e))?;
        let (stream, tags) = consume_queues(&channel, &link.options.queue_names())
            .await
            .map_err(|(doing, e)| amqp_error(name, &doing, e))?;
        tokio::spawn(watch(
            Arc::downgrade(&self.feed),
            Arc::clone(&self.pending),
            generation,
            name.to_owned(),
        ));
        Ok(Feed {
            generation,
            channel,
            tags,
            stream,
            buffer: VecDeque::new(),
            last_get: Instant::now(),
        })
    }
}

impl Feed {
    /// Moves up to `max` deliveries into `out`: the buffer's, what lapin has ready (giving its
    /// I/O task one turn before settling for a partial batch), else the first to come before
    /// `deadline`. True when a consumer ended.
    async fn take(
        &mut self,
        out: &mut Vec<(usize, Delivery)>,
        max: usize,
        deadline: Instant,
    ) -> bool {
        let refill = |buffer: &mut VecDeque<_>, out: &mut Vec<_>| {
            while out.len() < max {
                match buffer.pop_front() {
                    Some(d) => out.push(d),
                    None => break,
                }
            }
        };
        refill(&mut self.buffer, out);
        let mut yielded = false;
        loop {
            while out.len() < max {
                match self.stream.next().now_or_never() {
                    Some(item) => match step(item) {
                        Some(d) => out.push(d),
                        None => return true,
                    },
                    None if !yielded && !out.is_empty() => {
                        yielded = true;
                        // Cancel safety: what is held waits in the buffer across the await, so a
                        // dropped `get` (a worker shutting down) loses no delivery.
                        self.buffer.extend(out.drain(..));
                        tokio::task::yield_now().await;
                        refill(&mut self.buffer, out);
                    }
                    None => break,
                }
            }
            if !out.is_empty() || max == 0 {
                return false;
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Err(_) => return false,
                Ok(item) => match step(item) {
                    Some(d) => out.push(d),
                    None => return true,
                },
            }
        }
    }
}

/// Ends the consumers of session `generation` once no `get` asked for [`IDLE`]: cancels them and
/// requeues what they were pushed and no `get` took. Stops with the transport, or when those
/// consumers are gone.
async fn watch(
    feed: Weak<tokio::sync::Mutex<Option<Feed>>>,
    pending: Arc<std::sync::Mutex<Pending>>,
    generation: u64,
    name: String,
) {
    loop {
        tokio::time::sleep(IDLE / 2).await;
        let Some(feed) = feed.upgrade() else {
            return;
        };
        let mut guard = feed.lock().await;
        let Some(f) = guard.as_mut() else {
            return;
        };
        if f.generation != generation || !f.channel.status().connected() {
            return;
        }
        if f.last_get.elapsed() < IDLE {
            continue;
        }
        if let Some(f) = guard.take()
            && let Err(e) = give_back(f, &pending).await
        {
            tracing::warn!(messaging.destination.name = %name, error = %e, "amqp idle consumer not ended cleanly: its channel's deliveries go back when it closes");
        }
        return;
    }
}

/// Cancels the consumers, takes what they were pushed before the cancel took effect, and
/// requeues it with what the buffer held.
async fn give_back(mut f: Feed, pending: &std::sync::Mutex<Pending>) -> Result<(), lapin::Error> {
    let deadline = Instant::now() + Duration::from_secs(5);
    // What came before a consumer's cancel took effect is in the buffer, to give back with the
    // rest; should the cancel not complete, closing the connection gives back what is left.
    cancel_consumers(&f.channel, &f.tags, &mut f.stream, &mut f.buffer, deadline).await?;
    let requeue = BasicNackOptions {
        requeue: true,
        multiple: false,
    };
    for (_, d) in f.buffer.drain(..) {
        f.channel.basic_nack(d.delivery_tag, requeue).await?;
        pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .settled(f.generation, d.delivery_tag);
    }
    Ok(())
}
