//! Listeners that act (Messenger's `WorkerMessageReceivedEvent`, `StopWorkerException`,
//! `SendMessageToTransportsEvent`): a received hook vetoes handling, adds stamps or stops the
//! worker; a handler error stops it too; a send hook sees and stamps what is sent.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Job, queue_with};
use courier_core::worker::{Received, Skip};
use courier_core::{
    Envelope, Handler, HandlerError, InMemoryTransport, MessageBus, PriorityStamp, RedeliveryStamp,
    Sending, StopReason, Worker, async_trait,
};

/// A handled job's number and the priority stamp it carried.
type Handled = (u32, Option<u8>);

/// Records the jobs it handled.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Handled>>>);

#[async_trait]
impl Handler<Job> for Seen {
    async fn handle(&self, job: &Job, envelope: &Envelope) -> Result<(), HandlerError> {
        let priority = envelope.last::<PriorityStamp>().map(|p| p.0);
        self.0.lock().unwrap().push((job.0, priority));
        Ok(())
    }
}

impl Seen {
    fn jobs(&self) -> Vec<Handled> {
        self.0.lock().unwrap().clone()
    }
}

fn job(received: &Received<'_>) -> u32 {
    received
        .envelope()
        .message::<Job>()
        .map_or(u32::MAX, |j| j.0)
}

#[tokio::test(start_paused = true)]
async fn a_received_hook_skips_by_ack_or_reject_and_adds_stamps_the_handler_sees() {
    let q = queue_with(4).await;
    let seen = Seen::default();
    let bus = MessageBus::builder().handler(seen.clone()).build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .on_received(|r: &mut Received<'_>| match job(r) {
            0 => r.skip(Skip::Ack),
            1 => r.skip(Skip::Reject),
            2 => r.add_stamp(PriorityStamp(7)),
            _ => {}
        })
        .limit(4)
        .build()
        .run(Default::default())
        .await
        .unwrap();
    assert_eq!(
        seen.jobs(),
        [(2, Some(7)), (3, None)],
        "0 and 1 never handled"
    );
    assert_eq!((stats.handled, stats.skipped, stats.failed), (2, 2, 0));
    let rejected: Vec<u32> = q
        .rejected()
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect();
    assert_eq!(rejected, [1]);
    let acked: Vec<u32> = q
        .acked()
        .iter()
        .map(|e| e.message::<Job>().unwrap().0)
        .collect();
    assert_eq!(
        acked,
        [0, 2, 3],
        "the skipped-by-ack one is acked, not handled"
    );
}

#[tokio::test(start_paused = true)]
async fn a_received_hook_stops_the_worker_after_the_current_message() {
    let q = queue_with(10).await;
    let seen = Seen::default();
    let bus = MessageBus::builder().handler(seen.clone()).build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .fetch_size(4)
        .on_received(|r: &mut Received<'_>| {
            if job(r) == 2 {
                r.stop_worker();
            }
        })
        .build()
        .run(Default::default())
        .await
        .unwrap();
    assert_eq!(stats.stop_reason, Some(StopReason::StopRequested));
    let handled: Vec<u32> = seen.jobs().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        handled,
        [0, 1, 2],
        "message 2 is still handled, nothing after it"
    );
    assert_eq!(stats.handled, 3);
    // What it had fetched but not started is put back, not lost.
    assert_eq!(
        courier_core::MessageCount::message_count(&*q)
            .await
            .unwrap(),
        7
    );
    assert!(
        stats.released > 0,
        "fetched-ahead messages released: {stats:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_error_that_stops_the_worker_is_still_retried_as_its_inner_error_says() {
    let q = queue_with(5).await;
    let bus = MessageBus::builder()
        .handler_fn("h", |job: Arc<Job>| async move {
            if job.0 == 1 {
                Err(HandlerError::msg("the license expired").stop_worker())
            } else {
                Ok(())
            }
        })
        .build();
    let stats = Worker::builder(bus)
        .receiver("async", q.clone())
        .fetch_size(1)
        .sleep(Duration::from_millis(10))
        .build()
        .run(Default::default())
        .await
        .unwrap();
    assert_eq!(stats.stop_reason, Some(StopReason::StopRequested));
    assert_eq!((stats.handled, stats.failed, stats.retried), (1, 1, 1));
    // The retry is on the queue with its redelivery stamp: nothing dropped.
    let retried: Vec<_> = q
        .sent()
        .into_iter()
        .filter(|e| e.last::<RedeliveryStamp>().is_some())
        .collect();
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].message::<Job>().unwrap().0, 1);
}

#[tokio::test]
async fn a_send_hook_sees_the_transports_and_stamps_what_is_sent() {
    let a = Arc::new(InMemoryTransport::new());
    let b = Arc::new(InMemoryTransport::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let bus = MessageBus::builder()
        .transport("a", a.clone())
        .transport("b", b.clone())
        .route("test.*", ["a", "b"])
        .on_send(move |s: &mut Sending<'_>| {
            log.lock().unwrap().push((
                s.envelope().message::<Job>().map(|j| j.0),
                s.transports().to_vec(),
            ));
            s.add_stamp(PriorityStamp(3));
        })
        .build();
    bus.dispatch(Job(9)).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [(Some(9), vec!["a".to_owned(), "b".to_owned()])]
    );
    for t in [&a, &b] {
        let sent = t.sent();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].last::<PriorityStamp>(), Some(&PriorityStamp(3)));
    }
}

#[tokio::test(start_paused = true)]
async fn dispatch_to_sends_every_message_to_one_bus_whatever_its_bus_stamp() {
    let q = Arc::new(InMemoryTransport::new());
    let command = Seen::default();
    let events = Seen::default();
    let command_bus = MessageBus::builder()
        .name("command")
        .handler(command.clone())
        .build();
    let event_bus = MessageBus::builder()
        .name("event")
        .handler(events.clone())
        .build();
    // Stamped for the command bus (as dispatching on it would), consumed with `--bus event`.
    courier_core::Transport::send(
        &*q,
        Envelope::new(Job(1)).with(courier_core::BusNameStamp("command".into())),
    )
    .await
    .unwrap();
    let stats = Worker::builder(command_bus)
        .bus(event_bus.clone())
        .dispatch_to(event_bus)
        .receiver("async", q.clone())
        .limit(1)
        .build()
        .run(Default::default())
        .await
        .unwrap();
    assert_eq!(stats.handled, 1);
    assert_eq!(events.jobs(), [(1, None)]);
    assert!(command.jobs().is_empty());
}
