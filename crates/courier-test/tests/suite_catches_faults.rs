//! The conformance suite tested against deliberately broken transports: each case must fail
//! (panic, with a message saying what broke) on a transport with the fault it exists to catch,
//! and must pass on the same transport without the fault. Without this, a case that asserts
//! nothing would pass every transport.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use courier_core::{
    Capabilities, DelayStamp, DeliveryTagStamp, Encoded, Envelope, InMemoryOptions,
    InMemoryTransport, Listable, Transport, TransportError, TransportErrorKind,
    TransportMessageIdStamp, async_trait, encode,
};
use courier_test::{Harness, conformance};

const REDELIVER: Duration = Duration::from_millis(400);

/// What is wrong with the transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Claims delay capability but delivers delayed messages at once.
    IgnoresDelay,
    /// No delay capability, and a `DelayStamp` is silently ignored instead of refused.
    AcceptsDelayWithoutCapability,
    /// Declares a 10 s maximum delay; refuses longer ones only when `true`.
    MaxDelay(bool),
    /// Loses a header on the way (re-encodes without it).
    DropsHeader(&'static str),
    /// Returns each batch in reverse order.
    Reorders,
    /// Acks by message id, ignoring which delivery the ack is for.
    AcksByIdOnly,
    /// `ack_batch` fails when one of the envelopes is already acked.
    AckBatchFailsOnAcked,
    /// `retry` acks the old delivery without sending the new one.
    RetryLoses,
    /// `get` never returns.
    Hangs,
    /// `get` returns the first message of each batch twice.
    Duplicates,
    /// `get` fails on an undecodable message.
    GetFailsOnUndecodable,
    /// After a connection break, the next three operations fail with a transient error.
    FlakyAfterBreak,
    /// A connection break loses every stored message.
    LosesOnBreak,
    /// `keepalive` accepts the delivery and does nothing (its redelivery window is unchanged).
    KeepaliveDoesNothing,
}

#[derive(Debug)]
struct Faulty {
    inner: InMemoryTransport,
    fault: Fault,
    registry: Arc<courier_core::MessageRegistry>,
    /// Operations left to fail with a connection error.
    failing: AtomicUsize,
}

impl Faulty {
    fn transient(&self) -> Result<(), TransportError> {
        let left = self.failing.load(Ordering::SeqCst);
        if left > 0
            && self
                .failing
                .compare_exchange(left, left - 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            return Err(TransportError::new(
                TransportErrorKind::Connection,
                "faulty",
            ));
        }
        Ok(())
    }

    fn reencode_without(&self, envelope: Envelope, header: &str) -> Envelope {
        let Ok(mut wire) = encode(&envelope) else {
            return envelope;
        };
        wire.headers.remove(header);
        let mut out = self.registry.decode(wire);
        for id in envelope.all::<TransportMessageIdStamp>() {
            out = out.with(id.clone());
        }
        for tag in envelope.all::<DeliveryTagStamp>() {
            out = out.with(tag.clone());
        }
        out
    }
}

#[async_trait]
impl Transport for Faulty {
    async fn send(&self, envelope: Envelope) -> Result<Envelope, TransportError> {
        self.transient()?;
        match self.fault {
            Fault::IgnoresDelay | Fault::AcceptsDelayWithoutCapability => {
                let id = self
                    .inner
                    .send(envelope.clone().without_all::<DelayStamp>())
                    .await?;
                Ok(envelope.with(TransportMessageIdStamp(
                    id.id().unwrap_or_default().to_owned(),
                )))
            }
            Fault::MaxDelay(true) => {
                self.capabilities().check_delay("faulty", &envelope)?;
                self.inner.send(envelope).await
            }
            _ => self.inner.send(envelope).await,
        }
    }

    async fn get(&self, max: usize) -> Result<Vec<Envelope>, TransportError> {
        if self.fault == Fault::Hangs {
            std::future::pending::<()>().await;
        }
        self.transient()?;
        let mut got = self.inner.get(max).await?;
        match self.fault {
            Fault::DropsHeader(header) => {
                got = got
                    .into_iter()
                    .map(|e| self.reencode_without(e, header))
                    .collect();
            }
            Fault::Reorders => got.reverse(),
            Fault::Duplicates => {
                if let Some(first) = got.first().cloned() {
                    got.push(first);
                }
            }
            Fault::GetFailsOnUndecodable if got.iter().any(|e| e.decode_error().is_some()) => {
                return Err(TransportError::new(TransportErrorKind::Protocol, "faulty"));
            }
            _ => {}
        }
        Ok(got)
    }

    async fn ack(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.transient()?;
        if self.fault == Fault::AcksByIdOnly {
            if let Some(id) = envelope.id() {
                self.inner.remove(id).await?;
            }
            return Ok(());
        }
        self.inner.ack(envelope).await
    }

    async fn reject(&self, envelope: &Envelope) -> Result<(), TransportError> {
        self.inner.reject(envelope).await
    }

    async fn retry(&self, envelope: Envelope, delay: Duration) -> Result<(), TransportError> {
        if self.fault == Fault::RetryLoses {
            return self.inner.ack(&envelope).await;
        }
        self.inner.retry(envelope, delay).await
    }

    async fn keepalive(&self, envelope: &Envelope) -> Result<(), TransportError> {
        if self.fault == Fault::KeepaliveDoesNothing {
            return Ok(());
        }
        self.inner.keepalive(envelope).await
    }

    async fn ack_batch(&self, envelopes: &[Envelope]) -> Result<(), TransportError> {
        if self.fault == Fault::AckBatchFailsOnAcked {
            for e in envelopes {
                if self.inner.find(e.id().unwrap_or_default()).await?.is_none() {
                    return Err(TransportError::new(TransportErrorKind::NotFound, "faulty"));
                }
            }
        }
        self.inner.ack_batch(envelopes).await
    }

    fn abilities(&self) -> courier_core::Abilities<'_> {
        let mut abilities = courier_core::Abilities::none();
        abilities.listable = self.inner.abilities().listable;
        abilities.message_count = self.inner.abilities().message_count;
        abilities
    }

    fn capabilities(&self) -> Capabilities {
        let caps = self.inner.capabilities();
        match self.fault {
            Fault::AcceptsDelayWithoutCapability => {
                Capabilities::none().with_priority().with_redelivery()
            }
            Fault::MaxDelay(_) => caps.with_delay(Some(Duration::from_secs(10))),
            _ => caps,
        }
    }
}

struct FaultyHarness {
    fault: Fault,
    created: Mutex<Vec<Arc<Faulty>>>,
}

impl FaultyHarness {
    /// A faulty transport over an in-memory one redelivering after `redeliver`.
    fn make(&self, redeliver: Duration) -> Arc<dyn Transport> {
        let registry = courier_test::registry();
        let options = InMemoryOptions::default()
            .serialize(true)
            .redeliver_timeout(redeliver);
        let inner = InMemoryTransport::with_options(options, Arc::clone(&registry));
        let t = Arc::new(Faulty {
            inner,
            fault: self.fault,
            registry,
            failing: AtomicUsize::new(0),
        });
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&t));
        t
    }

    fn concrete(&self, transport: &Arc<dyn Transport>) -> Arc<Faulty> {
        let wanted = Arc::as_ptr(transport).cast::<()>();
        let created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        let found = created
            .iter()
            .find(|c| Arc::as_ptr(c).cast::<()>() == wanted);
        Arc::clone(found.expect("created by this harness"))
    }
}

#[async_trait]
impl Harness for FaultyHarness {
    async fn transport(&self) -> Arc<dyn Transport> {
        self.make(REDELIVER)
    }

    async fn transport_with_redelivery(&self, window: Duration) -> Option<Arc<dyn Transport>> {
        Some(self.make(window))
    }

    async fn expire_deliveries(&self, _transport: &Arc<dyn Transport>) {
        tokio::time::sleep(REDELIVER + Duration::from_millis(50)).await;
    }

    async fn send_raw(&self, transport: &Arc<dyn Transport>, encoded: Encoded) {
        self.concrete(transport).inner.send_raw(encoded);
    }

    async fn break_connection(&self, transport: &Arc<dyn Transport>) -> bool {
        let t = self.concrete(transport);
        match self.fault {
            Fault::FlakyAfterBreak => t.failing.store(3, Ordering::SeqCst),
            Fault::LosesOnBreak => t.inner.reset(),
            _ => {}
        }
        true
    }

    fn poll_window(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn operation_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn reconnect_timeout(&self) -> Duration {
        Duration::from_secs(2)
    }
}

type Case = for<'a> fn(&'a dyn Harness) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

macro_rules! case {
    ($name:ident) => {
        (|h| Box::pin(conformance::$name(h))) as Case
    };
}

/// Runs `case` on a transport with `fault`; returns the panic message, or `None` if it passed.
async fn run(case: Case, fault: Fault) -> Option<String> {
    let joined = tokio::spawn(async move {
        let h = FaultyHarness {
            fault,
            created: Mutex::default(),
        };
        case(&h).await;
    })
    .await;
    match joined {
        Ok(()) => None,
        Err(e) => {
            let payload = e.into_panic();
            Some(
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default(),
            )
        }
    }
}

/// The case passes without the fault and fails with it, saying `expected` in its message.
async fn catches(case: Case, fault: Fault, expected: &str) {
    if let Some(msg) = run(case, Fault::None).await {
        panic!("the case fails on a correct transport: {msg}");
    }
    match run(case, fault).await {
        None => panic!("the case passed on a transport with fault {fault:?}"),
        Some(msg) => assert!(
            msg.contains(expected),
            "fault {fault:?}: expected a message containing {expected:?}, got {msg:?}"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_case_catches_an_ignored_delay() {
    catches(
        case!(delayed_message_waits_its_delay),
        Fault::IgnoresDelay,
        "before its delay",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_refusal_case_catches_a_silently_accepted_delay() {
    let fault = Fault::AcceptsDelayWithoutCapability;
    let msg = run(case!(delay_is_refused_without_capability), fault)
        .await
        .expect("must fail");
    assert!(msg.contains("without delay capability accepted"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_delay_case_passes_when_enforced_and_catches_it_when_not() {
    assert_eq!(
        run(case!(delay_beyond_max_is_refused), Fault::MaxDelay(true)).await,
        None
    );
    let msg = run(case!(delay_beyond_max_is_refused), Fault::MaxDelay(false))
        .await
        .expect("must fail");
    assert!(msg.contains("beyond max_delay"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_cases_catch_a_lost_header() {
    catches(
        case!(round_trip),
        Fault::DropsHeader("x-courier-stamp-handled"),
        "headers changed",
    )
    .await;
    catches(
        case!(raw_message_round_trip),
        Fault::DropsHeader("x-custom-header"),
        "headers changed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_case_catches_reordering() {
    catches(
        case!(fifo_for_equal_priority),
        Fault::Reorders,
        "send order",
    )
    .await;
    catches(
        case!(send_batch_and_ack_batch_behave_like_loops),
        Fault::Reorders,
        "in order",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_ack_case_catches_an_ack_that_ignores_the_delivery() {
    catches(
        case!(late_ack_of_superseded_delivery_keeps_new_one),
        Fault::AcksByIdOnly,
        "deleted the message",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_batch_case_catches_a_batch_failing_on_acked_envelopes() {
    catches(
        case!(ack_batch_with_already_acked_envelopes_acks_the_rest),
        Fault::AckBatchFailsOnAcked,
        "ack_batch",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_case_catches_a_lost_retry() {
    catches(
        case!(retry_redelivers_once_with_new_stamps),
        Fault::RetryLoses,
        "message_count is 0, expected 1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_transport_fails_instead_of_hanging() {
    let msg = run(case!(round_trip), Fault::Hangs)
        .await
        .expect("must fail");
    assert!(msg.contains("did not finish within"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_case_catches_double_delivery() {
    catches(
        case!(concurrent_consumers_get_disjoint_messages),
        Fault::Duplicates,
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_case_catches_get_failing_on_an_undecodable_message() {
    catches(
        case!(bad_json_surfaces_as_decode_error),
        Fault::GetFailsOnUndecodable,
        "`get` failed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_case_rides_out_transient_errors_and_catches_loss() {
    assert_eq!(
        run(case!(connection_loss), Fault::FlakyAfterBreak).await,
        None,
        "transient errors must be retried"
    );
    let msg = run(case!(connection_loss), Fault::LosesOnBreak)
        .await
        .expect("must fail");
    assert!(
        msg.contains("messages lost across the connection loss: [0, 1, 2, 3, 4]"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_case_catches_a_keepalive_that_does_nothing() {
    catches(
        case!(keepalive_on_live_delivery_is_ok),
        Fault::KeepaliveDoesNothing,
        "keepalive did not postpone the redelivery",
    )
    .await;
}
