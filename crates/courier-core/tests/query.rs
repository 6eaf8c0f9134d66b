//! Query bus results: `MessageBus::query` returns the one handler's answer.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use courier_core::{
    BusError, Envelope, HandlerError, InMemoryTransport, Message, MessageBus, QueryError,
    QueryHandler, async_trait,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
struct GetTotal {
    order: u32,
}
impl Message for GetTotal {
    const NAME: &'static str = "shop.get_total";
}

#[derive(Debug, PartialEq)]
struct Total {
    order: u32,
    cents: u64,
}

struct Totals;

#[async_trait]
impl QueryHandler<GetTotal> for Totals {
    type Output = Total;
    async fn handle(&self, q: &GetTotal, _: &Envelope) -> Result<Total, HandlerError> {
        if q.order == 0 {
            return Err(HandlerError::unrecoverable("no such order"));
        }
        Ok(Total {
            order: q.order,
            cents: u64::from(q.order) * 100,
        })
    }
}

fn reason(err: BusError) -> QueryError {
    match err {
        BusError::Query { name, reason } => {
            assert_eq!(name, GetTotal::NAME);
            reason
        }
        other => panic!("expected a query error, got {other:?}"),
    }
}

#[tokio::test]
async fn query_returns_the_handlers_typed_answer() {
    let bus = MessageBus::builder()
        .query_handler::<GetTotal, _>(Totals)
        .build();
    let total: Total = bus.query(GetTotal { order: 7 }).await.unwrap();
    assert_eq!(
        total,
        Total {
            order: 7,
            cents: 700
        }
    );
}

#[tokio::test]
async fn query_fn_answers_and_dispatch_still_works() {
    let bus = MessageBus::builder()
        .query_fn("double", |q: Arc<GetTotal>| async move {
            Ok::<_, HandlerError>(q.order * 2)
        })
        .build();
    assert_eq!(bus.query::<u32>(GetTotal { order: 21 }).await.unwrap(), 42);
    // Plain dispatch of a query runs the handler and drops the answer.
    let envelope = bus.dispatch(GetTotal { order: 1 }).await.unwrap();
    assert_eq!(envelope.all::<courier_core::HandledStamp>().count(), 1);
}

#[tokio::test]
async fn query_handler_failure_is_the_handler_error() {
    let bus = MessageBus::builder()
        .query_handler::<GetTotal, _>(Totals)
        .build();
    let err = bus.query::<Total>(GetTotal { order: 0 }).await.unwrap_err();
    assert!(
        matches!(err, BusError::HandlerFailed { .. }),
        "expected the handler's failure, got {err:?}"
    );
}

#[tokio::test]
async fn query_handled_by_two_handlers_is_ambiguous() {
    let bus = MessageBus::builder()
        .query_handler_named::<GetTotal, _>("totals", Totals)
        .handler_fn("audit", |_: Arc<GetTotal>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    let err = bus.query::<Total>(GetTotal { order: 3 }).await.unwrap_err();
    match reason(err) {
        QueryError::SeveralHandlers { handlers } => assert_eq!(handlers, ["totals", "audit"]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn query_handled_without_an_answer_says_so() {
    let bus = MessageBus::builder()
        .handler_fn("plain", |_: Arc<GetTotal>| async {
            Ok::<(), HandlerError>(())
        })
        .build();
    let err = bus.query::<Total>(GetTotal { order: 3 }).await.unwrap_err();
    match reason(err) {
        QueryError::NoResult { handlers } => assert_eq!(handlers, ["plain"]),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn query_without_any_handler_is_no_handler() {
    let bus = MessageBus::builder().message::<GetTotal>().build();
    let err = bus.query::<Total>(GetTotal { order: 3 }).await.unwrap_err();
    assert!(matches!(err, BusError::NoHandler { .. }), "{err:?}");
}

#[tokio::test]
async fn query_asking_for_another_type_is_wrong_type() {
    let bus = MessageBus::builder()
        .query_handler_named::<GetTotal, _>("totals", Totals)
        .build();
    let err = bus
        .query::<String>(GetTotal { order: 3 })
        .await
        .unwrap_err();
    match reason(err) {
        QueryError::WrongType { handler, expected } => {
            assert_eq!(handler, "totals");
            assert!(expected.contains("String"), "{expected}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn query_routed_to_a_transport_is_sent_not_answered() {
    let queue = InMemoryTransport::new();
    let bus = MessageBus::builder()
        .transport("async", Arc::new(queue.clone()))
        .route("shop.*", ["async"])
        .query_handler::<GetTotal, _>(Totals)
        .build();
    let err = bus.query::<Total>(GetTotal { order: 3 }).await.unwrap_err();
    match reason(err) {
        QueryError::SentToTransport { transports } => assert_eq!(transports, ["async"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(queue.sent().len(), 1, "the routed query was sent");
    assert!(err_display_is_lowercase());
}

fn err_display_is_lowercase() -> bool {
    let e = BusError::Query {
        name: "x".into(),
        reason: QueryError::SentToTransport {
            transports: vec!["async".into()],
        },
    };
    let s = courier_core::error_chain(&e).to_string();
    s == "query `x` has no single answer: sent to transport(s) async instead of being handled"
}
