//! Paging through runs (`RunStore::page`, the dashboard's runs list) and counting them by
//! status, against the in-memory store, SQLite, PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used)]

mod support;

use courier_runs::{PageFrom, Run, RunCursor, RunPageQuery, RunStatus};
use uuid::Uuid;

use support::Fixture;

/// Eleven runs of agents `a` and `b`, created in pairs at the same millisecond (ties are
/// ordered by id), every third one cancelled. Returns them newest first.
async fn seed(fx: &Fixture) -> Vec<Run> {
    for i in 0..11_i64 {
        let run = fx.queued(if i % 2 == 0 { "a" } else { "b" }).await;
        fx.set_created_at(run.id, 1_000 + i / 2).await;
        if i % 3 == 0 {
            assert!(fx.store.cancel(run.id).await.unwrap());
        }
    }
    let all = fx.store.list(None, 100).await.unwrap();
    assert_eq!(all.len(), 11);
    all
}

fn ids(runs: &[Run]) -> Vec<Uuid> {
    runs.iter().map(|r| r.id).collect()
}

async fn pages_walk_the_newest_first_order_both_ways(fx: &Fixture) {
    let all = seed(fx).await;
    let mut sorted = all.clone();
    sorted.sort_by_key(|r| std::cmp::Reverse(RunCursor::of(r)));
    assert_eq!(ids(&all), ids(&sorted), "created_at DESC, id DESC");

    // Forward, three at a time.
    let mut pages: Vec<Vec<Run>> = Vec::new();
    let mut q = RunPageQuery::newest(3);
    loop {
        let page = fx.store.page(&q).await.unwrap();
        if page.is_empty() {
            break;
        }
        q = q
            .clone()
            .from(PageFrom::Before(RunCursor::of(page.last().unwrap())));
        pages.push(page);
    }
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 2]);
    assert_eq!(ids(&pages.concat()), ids(&all), "every run once, in order");

    // Back from the last page: each `after` page is the one before it.
    for i in (1..pages.len()).rev() {
        let first = RunCursor::of(&pages[i][0]);
        let back = fx
            .store
            .page(&RunPageQuery::newest(3).from(PageFrom::After(first)))
            .await
            .unwrap();
        assert_eq!(ids(&back), ids(&pages[i - 1]), "page {i} back");
    }
    let top = RunCursor::of(&all[0]);
    let newer = fx
        .store
        .page(&RunPageQuery::newest(3).from(PageFrom::After(top)))
        .await
        .unwrap();
    assert!(newer.is_empty(), "nothing is newer than the newest");
}

async fn pages_filter_by_status_and_agent(fx: &Fixture) {
    let all = seed(fx).await;
    let expect =
        |f: &dyn Fn(&Run) -> bool| ids(&all.iter().filter(|r| f(r)).cloned().collect::<Vec<_>>());
    let page = |q: RunPageQuery| async move { ids(&fx.store.page(&q).await.unwrap()) };
    assert_eq!(
        page(RunPageQuery::newest(50).status(RunStatus::Cancelled)).await,
        expect(&|r| r.status == RunStatus::Cancelled)
    );
    assert_eq!(
        page(RunPageQuery::newest(50).agent("a")).await,
        expect(&|r| r.agent == "a")
    );
    assert_eq!(
        page(
            RunPageQuery::newest(50)
                .agent("b")
                .status(RunStatus::Queued)
        )
        .await,
        expect(&|r| r.agent == "b" && r.status == RunStatus::Queued)
    );
    // A filtered page after a cursor.
    let queued = expect(&|r| r.status == RunStatus::Queued);
    let first = fx
        .store
        .page(&RunPageQuery::newest(2).status(RunStatus::Queued))
        .await
        .unwrap();
    let next = page(
        RunPageQuery::newest(50)
            .status(RunStatus::Queued)
            .from(PageFrom::Before(RunCursor::of(&first[1]))),
    )
    .await;
    assert_eq!(next, queued[2..]);
    assert!(
        page(RunPageQuery::newest(5).agent("nobody"))
            .await
            .is_empty()
    );
}

async fn runs_are_counted_by_status(fx: &Fixture) {
    seed(fx).await;
    let counts = fx.store.count_by_status().await.unwrap();
    assert_eq!(
        counts,
        [(RunStatus::Queued, 7), (RunStatus::Cancelled, 4)],
        "in RunStatus::ALL order, empty statuses left out"
    );
}

/// On SQLite, every page statement seeks in one of the listing indexes and needs no sort.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn every_page_statement_is_served_by_a_listing_index() {
    use courier_runs::{RunStore, SqlRunStore, SqlRunStoreOptions};
    use sqlx::Row as _;

    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}?mode=rwc", dir.0.join("runs.db").display());
    let store = SqlRunStore::connect(&dsn, SqlRunStoreOptions::default())
        .await
        .unwrap();
    store.setup().await.unwrap();
    let pool = sqlx::SqlitePool::connect(&dsn).await.unwrap();
    let cursor = RunCursor {
        created_at: 5,
        id: Uuid::nil(),
    };
    for status in [None, Some(RunStatus::Failed)] {
        for agent in [None, Some("a")] {
            for from in [
                PageFrom::Newest,
                PageFrom::Before(cursor),
                PageFrom::After(cursor),
            ] {
                let mut q = RunPageQuery::newest(50).from(from);
                q.status = status;
                q.agent = agent.map(str::to_owned);
                let sql = format!("EXPLAIN QUERY PLAN {}", store.page_query(&q));
                let mut explain = sqlx::query(&sql);
                if let Some(a) = agent {
                    explain = explain.bind(a);
                }
                if from != PageFrom::Newest {
                    explain = explain
                        .bind(5_i64)
                        .bind(5_i64)
                        .bind(Uuid::nil().to_string());
                }
                let plan: Vec<String> = explain
                    .bind(50_i64)
                    .fetch_all(&pool)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get::<String, _>("detail"))
                    .collect();
                let plan = plan.join("; ");
                assert!(
                    plan.contains("USING INDEX courier_runs_") && plan.contains("_created_idx"),
                    "{q:?}: {plan}"
                );
                assert!(!plan.contains("TEMP B-TREE"), "{q:?} sorts: {plan}");
            }
        }
    }
}

macro_rules! listing_test {
    ($fixture:path, $name:ident $(, #[$m:meta])*) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$m])*
        async fn $name() {
            let fx = $fixture().await;
            let test = tokio::time::timeout(Duration::from_secs(60), super::$name(&fx));
            let result = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(test)).await;
            fx.cleanup().await;
            match result {
                Ok(done) => done.expect("test timed out"),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    };
}

macro_rules! listing_tests {
    ($fixture:path $(, #[$m:meta])*) => {
        use std::time::Duration;
        listing_test!($fixture, pages_walk_the_newest_first_order_both_ways $(, #[$m])*);
        listing_test!($fixture, pages_filter_by_status_and_agent $(, #[$m])*);
        listing_test!($fixture, runs_are_counted_by_status $(, #[$m])*);
    };
}

mod memory {
    async fn fixture() -> super::Fixture {
        super::support::memory()
    }
    listing_tests!(fixture);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    listing_tests!(super::support::sqlite);
}

#[cfg(feature = "postgres")]
mod postgres {
    listing_tests!(
        super::support::postgres,
        #[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
    );
}

#[cfg(feature = "mysql")]
mod mysql {
    listing_tests!(
        super::support::mysql,
        #[ignore = "needs mysql: set COURIER_TEST_MYSQL_URL"]
    );
}
