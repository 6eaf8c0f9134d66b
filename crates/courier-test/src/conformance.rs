//! The conformance cases (the transport contract's items 1-10, plus batch equivalence).
//!
//! Each case is a `pub async fn(&dyn Harness)` that takes a fresh transport from the harness,
//! asserts one behaviour precisely (exact counts, exact bytes) and panics with a message that
//! says what was expected. Every await on the transport is bounded by
//! [`support::op_timeout`], so a broken transport fails a case instead of hanging it.
//! Consuming goes through [`support::receive`], which loops `get` until the expected number of
//! messages came or a deadline passed (a `get` may return fewer than asked, or wait up to the
//! poll window).
//!
//! Cases whose capability a transport lacks return early: priority order without
//! `capabilities().priority` (or [`Harness::supports_priority`]), count checks without
//! `as_message_count`, listing without `as_listable`, delay timing without
//! `capabilities().delay` (such a transport must instead refuse a `DelayStamp`), and connection
//! loss where [`Harness::break_connection`] returns `false`.
//!
//! [`conformance_suite!`](crate::conformance_suite) expands to one `#[tokio::test]` per case.

mod admin;
mod batch;
mod concurrency;
mod connection;
mod decode;
mod delay;
mod order;
mod redelivery;
mod removal;
mod retry;
mod round_trip;
pub mod support;

pub use admin::{
    listable_finds_lists_and_removes_by_id, message_count_is_exact_when_idle, setup_is_idempotent,
};
pub use batch::{
    ack_and_get_acks_then_receives, ack_batch_with_already_acked_envelopes_acks_the_rest,
    send_batch_and_ack_batch_behave_like_loops,
};
pub use concurrency::concurrent_consumers_get_disjoint_messages;
pub use connection::connection_loss;
pub use decode::{
    bad_json_surfaces_as_decode_error, missing_type_surfaces_as_decode_error,
    poison_messages_surface_as_decode_errors, unknown_type_surfaces_as_decode_error,
};
pub use delay::{
    DELAY, delay_beyond_max_is_refused, delay_is_refused_without_capability,
    delayed_message_waits_its_delay,
};
pub use order::{fifo_for_equal_priority, higher_priority_first};
pub use redelivery::{
    keepalive_on_live_delivery_is_ok, late_ack_of_superseded_delivery_keeps_new_one,
    unacked_message_is_redelivered,
};
pub use removal::{
    ack_and_reject_remove_for_good, double_ack_is_harmless, double_reject_is_harmless,
};
pub use retry::{
    retry_redelivers_once_with_new_stamps, retry_without_delay_is_immediately_available,
};
pub use round_trip::{
    UNICODE_TEXT, fully_stamped, large_body_round_trip, raw_message_round_trip, round_trip,
};

use crate::Harness;

/// Expands to one `#[tokio::test]` per conformance case for a harness constructor
/// `async fn() -> impl Harness`, optionally `#[ignore]`d with a reason.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path $(, ignore = $reason:literal)?) => {
        $crate::__with_cases!(__conformance_cases!($make, [$($reason)?]));
    };
}

/// Calls `$callback!(args..., every case name)`: the one list of cases.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cases {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback! {
            $($args)*,
            // 1. round trip
            round_trip,
            large_body_round_trip,
            raw_message_round_trip,
            // 2. ack / reject
            ack_and_reject_remove_for_good,
            double_ack_is_harmless,
            double_reject_is_harmless,
            // 3. delay
            delayed_message_waits_its_delay,
            delay_beyond_max_is_refused,
            delay_is_refused_without_capability,
            // 4. order
            fifo_for_equal_priority,
            higher_priority_first,
            // 5. redelivery
            unacked_message_is_redelivered,
            late_ack_of_superseded_delivery_keeps_new_one,
            keepalive_on_live_delivery_is_ok,
            // 6. concurrency
            concurrent_consumers_get_disjoint_messages,
            // 7. retry
            retry_redelivers_once_with_new_stamps,
            retry_without_delay_is_immediately_available,
            // 8. setup, count, listing
            setup_is_idempotent,
            message_count_is_exact_when_idle,
            listable_finds_lists_and_removes_by_id,
            // 9. undecodable messages
            unknown_type_surfaces_as_decode_error,
            bad_json_surfaces_as_decode_error,
            missing_type_surfaces_as_decode_error,
            poison_messages_surface_as_decode_errors,
            // 10. connection loss
            connection_loss,
            // batch equivalence
            send_batch_and_ack_batch_behave_like_loops,
            ack_batch_with_already_acked_envelopes_acks_the_rest,
            ack_and_get_acks_then_receives,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __run_cases {
    ($h:expr, $($case:ident),* $(,)?) => {
        $(
            println!("conformance: {}", stringify!($case));
            $crate::conformance::$case($h).await;
        )*
    };
}

/// Runs every case in sequence against one harness, printing each case's name: for examples
/// and ad-hoc checks (tests should prefer [`conformance_suite!`](crate::conformance_suite), one
/// test per case).
pub async fn run_all(h: &dyn Harness) {
    crate::__with_cases!(__run_cases!(h));
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    // One case at a time: the optional ignore reason cannot repeat alongside the case list.
    ($make:path, [$($reason:literal)?], $case:ident $(, $rest:ident)* $(,)?) => {
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[ignore = $reason])?
        async fn $case() {
            let harness = $make().await;
            $crate::conformance::$case(&harness).await;
        }
        $crate::__conformance_cases!($make, [$($reason)?], $($rest),*);
    };
    ($make:path, [$($reason:literal)?] $(,)?) => {};
}
