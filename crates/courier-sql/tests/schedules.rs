//! The schedule store in `<table>_schedules` and the pause flag in `<table>_paused`, on every
//! dialect: one lease holder at a time, ticks recorded only by the live holder and only forward,
//! an expired lease taken over with its last tick, the pause flag shared by connections, and the
//! rate-limit bucket in `<table>_limits` shared by concurrent takers on two connections.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::SqlHarness;
use courier_core::schedule::Held;
use courier_core::{RateLimit, ScheduleStore, Transport};

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the database answered within 30 s")
}

fn store(t: &dyn Transport) -> &dyn ScheduleStore {
    t.as_schedule_store()
        .expect("a SQL transport has a schedule store")
}

async fn one_holder_records_each_tick_once_and_an_expired_lease_moves_on(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    let b = h.reuse(&table).await;
    let lease = Duration::from_secs(1);
    let (sa, sb) = (store(&*a), store(&*b));
    assert_eq!(
        within(sa.claim("s", "a", lease)).await.unwrap(),
        Some(Held::new(None))
    );
    assert_eq!(
        within(sb.claim("s", "b", lease)).await.unwrap(),
        None,
        "held by a"
    );
    assert!(
        !within(sb.advance("s", "b", 1_000)).await.unwrap(),
        "not the holder"
    );
    assert!(within(sa.advance("s", "a", 1_000)).await.unwrap());
    assert!(!within(sa.advance("s", "a", 1_000)).await.unwrap(), "once");
    assert!(
        !within(sa.advance("s", "a", 999)).await.unwrap(),
        "only forward"
    );
    assert_eq!(
        within(sa.claim("s", "a", lease)).await.unwrap(),
        Some(Held::new(Some(1_000))),
        "renewed with the last tick"
    );
    let state = within(sb.state("s")).await.unwrap().unwrap();
    assert_eq!(
        (state.owner.as_deref(), state.last_tick_ms),
        (Some("a"), Some(1_000))
    );
    assert_eq!(within(sb.state("other")).await.unwrap(), None);

    // a stops renewing: once the lease expires, b takes it with the last tick.
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        if let Some(held) = within(sb.claim("s", "b", lease)).await.unwrap() {
            break held;
        }
        assert!(Instant::now() < deadline, "the lease expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(held, Held::new(Some(1_000)));
    assert!(
        !within(sa.advance("s", "a", 2_000)).await.unwrap(),
        "a lost the lease"
    );
    assert_eq!(within(sa.claim("s", "a", lease)).await.unwrap(), None);
    assert!(within(sb.advance("s", "b", 2_000)).await.unwrap());
}

async fn the_pause_flag_is_shared_and_idempotent(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    let b = h.reuse(&table).await;
    let (pa, pb) = (
        a.abilities().pausable.unwrap(),
        b.abilities().pausable.unwrap(),
    );
    assert!(!within(pb.is_paused()).await.unwrap());
    assert!(within(pa.set_paused(true)).await.unwrap());
    assert!(
        !within(pa.set_paused(true)).await.unwrap(),
        "already paused"
    );
    assert!(
        within(pb.is_paused()).await.unwrap(),
        "seen through another connection"
    );
    assert!(within(pb.set_paused(false)).await.unwrap());
    assert!(
        !within(pa.set_paused(false)).await.unwrap(),
        "already running"
    );
    assert!(!within(pa.is_paused()).await.unwrap());
}

async fn a_shared_bucket_never_grants_more_than_its_rate(h: &SqlHarness) {
    let (a, table) = h.make("").await;
    let b = h.reuse(&table).await;
    let limit = RateLimit::new(20, Duration::from_secs(1))
        .unwrap()
        .with_burst(4);
    // A new row is a full bucket: the first take creates it (granting nothing) or takes.
    let limiter = a.abilities().rate_limiter.unwrap();
    let mut first = within(limiter.take(&limit, 10)).await.unwrap();
    if first.granted == 0 {
        first = within(limiter.take(&limit, 10)).await.unwrap();
    }
    assert_eq!(first.granted, 4, "the burst, at most");
    let empty = within(b.abilities().rate_limiter.unwrap().take(&limit, 1))
        .await
        .unwrap();
    assert_eq!(empty.granted, 0, "seen through another connection");
    assert!(
        empty.wait > Duration::ZERO && empty.wait <= Duration::from_millis(60),
        "the next token is due within one emission interval: {:?}",
        empty.wait
    );
    // Eight takers on two connections for two seconds: at most burst + 2 s * 20/s.
    let started = Instant::now();
    let takers = (0..8).map(|i| {
        let t = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move {
            let mut got = 0_u32;
            while started.elapsed() < Duration::from_secs(2) {
                let taken = within(t.abilities().rate_limiter.unwrap().take(&limit, 1))
                    .await
                    .unwrap();
                got += taken.granted;
                tokio::time::sleep(taken.wait.max(Duration::from_millis(1))).await;
            }
            got
        })
    });
    let mut total = 0;
    for taker in takers.collect::<Vec<_>>() {
        total += taker.await.unwrap();
    }
    assert!((20..=45).contains(&total), "{total} tokens in 2 s at 20/s");
}

macro_rules! on_every_dialect {
    ($($case:ident),*) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&crate::common::sqlite().await).await;
                }
            )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
                async fn $case() {
                    super::$case(&crate::common::postgres().await).await;
                }
            )*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
                async fn $case() {
                    super::$case(&crate::common::mysql().await).await;
                }
            )*
        }
    };
}

on_every_dialect!(
    one_holder_records_each_tick_once_and_an_expired_lease_moves_on,
    the_pause_flag_is_shared_and_idempotent,
    a_shared_bucket_never_grants_more_than_its_rate
);
