//! The conformance cases (DESIGN.md §3). Each takes a [`Harness`](crate::Harness).
//! (Being written.)

use crate::Harness;

/// send -> get -> ack round trip.
pub async fn round_trip(_h: &dyn Harness) {}

/// Expands to one `#[tokio::test]` per conformance case for a harness constructor
/// `async fn() -> impl Harness`, optionally `#[ignore]`d with a reason.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path $(, ignore = $reason:literal)?) => {
        $crate::__conformance_cases!($make, [$($reason)?], round_trip);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($make:path, [$($reason:literal)?], $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[ignore = $reason])?
            async fn $case() {
                let harness = $make().await;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}
