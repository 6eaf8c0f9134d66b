//! Schedules on the in-memory store with a paused clock: each tick fires exactly once across
//! several schedulers, a killed lease holder's ticks are caught up or skipped as configured.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_core::{
    BoxError, InMemoryScheduleStore, Missed, Schedule, ScheduleStore, Scheduler, Trigger,
    async_trait, schedule::Fire,
};
use tokio::time::Instant;

#[derive(Default, Clone)]
struct Ticks(Arc<Mutex<Vec<i64>>>);

#[async_trait]
impl Fire for Ticks {
    async fn fire(&self, _: &str, tick_ms: i64) -> Result<(), BoxError> {
        self.0.lock().unwrap().push(tick_ms);
        Ok(())
    }
}

impl Ticks {
    fn sorted(&self) -> Vec<i64> {
        let mut t = self.0.lock().unwrap().clone();
        t.sort_unstable();
        t
    }
}

/// The virtual wall clock: a fixed epoch plus the paused tokio clock's elapsed time.
struct Clock(Instant);

impl Clock {
    const BASE: i64 = 1_700_000_000_000;
    fn now(&self) -> i64 {
        Self::BASE + i64::try_from(self.0.elapsed().as_millis()).unwrap()
    }
}

fn schedulers(store: &Arc<InMemoryScheduleStore>, ticks: &Ticks, missed: Missed) -> Vec<Scheduler> {
    (0..3)
        .map(|i| {
            let every = Trigger::every(Duration::from_secs(1)).unwrap();
            Scheduler::new(store.clone() as Arc<dyn ScheduleStore>, format!("w{i}"))
                .lease(Duration::from_secs(3))
                .schedule(Schedule::new("tick", every, ticks.clone()).missed(missed))
        })
        .collect()
}

/// Polls the live schedulers every 100 ms of virtual time for `ms`.
async fn drive(clock: &Clock, all: &[Scheduler], alive: impl Fn(usize, i64) -> bool, ms: i64) {
    let end = clock.now() + ms;
    while clock.now() < end {
        for (i, s) in all.iter().enumerate() {
            if alive(i, clock.now()) {
                s.poll(clock.now()).await.unwrap();
            }
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
}

fn assert_consecutive(ticks: &[i64]) {
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1_000,
            "every tick once, none missed: {ticks:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn three_schedulers_fire_each_tick_exactly_once() {
    let store = Arc::new(InMemoryScheduleStore::new());
    let ticks = Ticks::default();
    let all = schedulers(&store, &ticks, Missed::Skip);
    let clock = Clock(Instant::now());
    drive(&clock, &all, |_, _| true, 30_000).await;
    let fired = ticks.sorted();
    assert!(
        (29..=31).contains(&fired.len()),
        "30 +-1 fires, got {}",
        fired.len()
    );
    assert_consecutive(&fired);
}

#[tokio::test(start_paused = true)]
async fn a_killed_holder_is_caught_up_by_another() {
    let store = Arc::new(InMemoryScheduleStore::new());
    let ticks = Ticks::default();
    let all = schedulers(&store, &ticks, Missed::CatchUp(10));
    let clock = Clock(Instant::now());
    let killed_at = Clock::BASE + 5_000;
    // w0 polls first, so it holds the lease; it dies at 5 s.
    drive(&clock, &all, |i, now| i != 0 || now < killed_at, 20_000).await;
    let fired = ticks.sorted();
    assert!(
        (19..=21).contains(&fired.len()),
        "20 +-1 fires, got {fired:?}"
    );
    assert_consecutive(&fired);
}

#[tokio::test(start_paused = true)]
async fn skip_drops_the_ticks_a_killed_holder_missed() {
    let store = Arc::new(InMemoryScheduleStore::new());
    let ticks = Ticks::default();
    let all = schedulers(&store, &ticks, Missed::Skip);
    let clock = Clock(Instant::now());
    let killed_at = Clock::BASE + 5_000;
    drive(&clock, &all, |i, now| i != 0 || now < killed_at, 20_000).await;
    let fired = ticks.sorted();
    // The lease (3 s) outlives w0 by up to 3 s: the ticks in between are skipped but the newest.
    let gaps: Vec<i64> = fired.windows(2).map(|p| p[1] - p[0]).collect();
    assert_eq!(
        gaps.iter().filter(|g| **g > 1_000).count(),
        1,
        "one gap: {fired:?}"
    );
    assert!(gaps.iter().all(|g| *g <= 4_000 && *g > 0), "{fired:?}");
    assert!(fired.len() <= 19, "missed ticks are not fired: {fired:?}");
}

#[tokio::test(start_paused = true)]
async fn catch_up_is_bounded_after_a_long_downtime() {
    let store = Arc::new(InMemoryScheduleStore::new());
    let ticks = Ticks::default();
    let all = schedulers(&store, &ticks, Missed::CatchUp(10));
    let clock = Clock(Instant::now());
    drive(&clock, &all[..1], |_, _| true, 2_000).await;
    let before = ticks.sorted().len();
    // Nobody runs for a minute, then w1 starts: only the newest 10 missed ticks fire.
    tokio::time::advance(Duration::from_secs(60)).await;
    all[1].poll(clock.now()).await.unwrap();
    let after = ticks.sorted();
    assert_eq!(after.len() - before, 10, "{after:?}");
    assert_consecutive(&after[before..]);
    assert!(
        clock.now() - after.last().unwrap() < 1_000,
        "the newest is the last due tick"
    );
}

/// Fails every fire while `down` is set, else records the tick.
#[derive(Default, Clone)]
struct Flaky {
    ticks: Ticks,
    down: Arc<std::sync::atomic::AtomicBool>,
    failures: Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait]
impl Fire for Flaky {
    async fn fire(&self, schedule: &str, tick_ms: i64) -> Result<(), BoxError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            self.failures
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err("the transport is down".into());
        }
        self.ticks.fire(schedule, tick_ms).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_tick_whose_fire_failed_is_fired_again_and_recorded_only_then() {
    let store = Arc::new(InMemoryScheduleStore::new());
    let flaky = Flaky::default();
    let every = Trigger::every(Duration::from_secs(1)).unwrap();
    let all = [
        Scheduler::new(store.clone() as Arc<dyn ScheduleStore>, "w0")
            .lease(Duration::from_secs(3))
            .schedule(Schedule::new("tick", every, flaky.clone()).missed(Missed::CatchUp(10))),
    ];
    let clock = Clock(Instant::now());
    drive(&clock, &all, |_, _| true, 3_000).await;
    let before = store.state("tick").await.unwrap().unwrap().last_tick_ms;
    // Down for 2.5 s: the ticks due meanwhile fail, and are not recorded as fired.
    flaky.down.store(true, std::sync::atomic::Ordering::SeqCst);
    drive(&clock, &all, |_, _| true, 2_500).await;
    assert!(
        flaky.failures.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "fires failed while down"
    );
    let during = store.state("tick").await.unwrap().unwrap().last_tick_ms;
    assert_eq!(during, before, "a failed tick is not recorded");
    flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
    drive(&clock, &all, |_, _| true, 3_000).await;
    let fired = flaky.ticks.sorted();
    assert!(
        fired.len() >= 7,
        "every tick once the fire works: {fired:?}"
    );
    assert_consecutive(&fired);
}
