//! The reaper and the dashboard's reads at scale: with 1,000,000 finished runs, 100,000 queued
//! and a few thousand running or waiting, a real reaper pass and the dashboard's runs list and
//! run page are planned on indexes: no full read of the runs table, and no sort (a sort under a
//! `LIMIT` reads every row that matches before it returns the first).
//!
//! The statements are the store's own: the test runs the real `Reaper::reap` and
//! `RunStore::page` / `find` / `events` / `steps`, records every statement sqlx logs that names
//! this test's runs table, and asks the database for each one's plan: `EXPLAIN QUERY PLAN` on
//! SQLite; on PostgreSQL `EXPLAIN (FORMAT JSON)` of the prepared statement's generic plan, the
//! plan that does not depend on the values bound, which PostgreSQL may settle on for a statement
//! a pooled connection runs often. A page of one rare status must seek in the status's index.
//! The measured times are printed, not asserted (the machine varies).
//!
//! Run: `cargo test -p courier-runs --all-features --test scale -- --include-ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod support;

use std::time::{Duration, Instant};

use courier_core::{InMemoryTransport, MessageBus};
use courier_runs::{
    Dialect, PageFrom, ReapOptions, RunCursor, RunPageQuery, RunStatus, Runtime, SqlRunStore,
};
use sqlx::Connection as _;
use uuid::Uuid;

use support::Fixture;

/// Finished runs (completed, failed, cancelled in turn), finished 10 to 30 days ago.
const FINISHED: i64 = 1_000_000;
/// Queued runs, due within the last 200 seconds (none overdue).
const QUEUED: i64 = 100_000;
/// Of each small group: running under an expired lease, queued past the redispatch threshold,
/// waiting with their wake-up due.
const FEW: i64 = 10;
/// Running under a live lease, and waiting until later.
const LIVE: i64 = 1_000;
const DAY_MS: i64 = 86_400_000;
/// How long a finished run is kept.
const RETENTION: Duration = Duration::from_secs(7 * 86_400);
const REDISPATCH_AFTER: Duration = Duration::from_secs(900);

/// Every statement sqlx logs, recorded by a process-wide subscriber (sqlx's SQLite driver runs
/// its statements on a thread of its own, so a thread's default subscriber would miss them).
mod statements {
    use std::sync::{Mutex, Once, PoisonError};

    use tracing::field::{Field, Visit};
    use tracing::level_filters::LevelFilter;
    use tracing::span::{Attributes, Id, Record};
    use tracing::subscriber::Interest;
    use tracing::{Event, Metadata, Subscriber};

    /// A statement sqlx ran: its text and how long it took.
    #[derive(Debug, Clone)]
    pub(super) struct Ran {
        pub(super) sql: String,
        pub(super) secs: f64,
    }

    static RAN: Mutex<Vec<Ran>> = Mutex::new(Vec::new());
    static INSTALL: Once = Once::new();

    const TARGET: &str = "sqlx::query";

    struct Recorder;

    #[derive(Default)]
    struct Fields {
        sql: String,
        secs: f64,
    }

    impl Visit for Fields {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "db.statement" {
                value.trim().clone_into(&mut self.sql);
            }
        }

        fn record_f64(&mut self, field: &Field, value: f64) {
            if field.name() == "elapsed_secs" {
                self.secs = value;
            }
        }

        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl Subscriber for Recorder {
        fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
            if meta.target() == TARGET {
                Interest::always()
            } else {
                Interest::never()
            }
        }

        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            meta.target() == TARGET
        }

        fn max_level_hint(&self) -> Option<LevelFilter> {
            Some(LevelFilter::TRACE)
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            // A statement of four words or fewer (BEGIN, COMMIT) is logged by its summary only.
            if !fields.sql.is_empty() {
                RAN.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Ran {
                        sql: fields.sql,
                        secs: fields.secs,
                    });
            }
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }

    /// Installs the recorder (once per process).
    pub(super) fn install() {
        INSTALL.call_once(|| {
            tracing::subscriber::set_global_default(Recorder).expect("no other subscriber");
        });
    }

    /// Where the log is now.
    pub(super) fn mark() -> usize {
        RAN.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The statements logged since `mark` that name `table`.
    pub(super) fn since(mark: usize, table: &str) -> Vec<Ran> {
        RAN.lock().unwrap_or_else(PoisonError::into_inner)[mark..]
            .iter()
            .filter(|r| super::names(&r.sql, table))
            .cloned()
            .collect()
    }
}

/// Whether `sql` names `table` itself (not `{table}_steps`, which starts with its name).
fn names(sql: &str, table: &str) -> bool {
    sql.match_indices(table).any(|(at, _)| {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let before = sql[..at].chars().next_back().is_none_or(|c| !ident(c));
        let after = sql[at + table.len()..]
            .chars()
            .next()
            .is_none_or(|c| !ident(c));
        before && after
    })
}

/// One group of runs filled by one set-based statement; each expression may use `i` (1..=n).
struct Group {
    n: i64,
    status: &'static str,
    claimed_by: &'static str,
    lease_expires: String,
    created_at: String,
    finished_at: String,
    due_at: String,
}

/// The groups: the finished runs, the queued backlog, and the runs each reaper step acts on.
fn groups(now: i64) -> Vec<Group> {
    let group = |n, status, created_at: String| Group {
        n,
        status,
        claimed_by: "NULL",
        lease_expires: "0".into(),
        due_at: created_at.clone(),
        created_at,
        finished_at: "NULL".into(),
    };
    let finished_status =
        "CASE i % 3 WHEN 0 THEN 'completed' WHEN 1 THEN 'failed' ELSE 'cancelled' END";
    // Spread over 20 days, 30 to 10 days ago: all older than the retention.
    let finished_created = format!("{} + i * {}", now - 30 * DAY_MS, 20 * DAY_MS / FINISHED);
    vec![
        Group {
            finished_at: format!("{finished_created} + 1000"),
            ..group(FINISHED, finished_status, finished_created.clone())
        },
        group(QUEUED, "'queued'", format!("{} + i * 2", now - 2 * QUEUED)),
        Group {
            claimed_by: "'live-worker'",
            lease_expires: format!("{}", now + 600_000),
            ..group(LIVE, "'running'", format!("{} + i", now - 300_000))
        },
        Group {
            claimed_by: "'dead-worker'",
            lease_expires: format!("{}", now - 60_000),
            ..group(FEW, "'running'", format!("{} + i", now - 400_000))
        },
        group(FEW, "'queued'", format!("{} + i", now - 3_600_000)),
        Group {
            due_at: format!("{}", now - 1_000),
            ..group(FEW, "'waiting'", format!("{} + i", now - 500_000))
        },
        Group {
            due_at: format!("{}", now + 3_600_000),
            ..group(LIVE, "'waiting'", format!("{} + i", now - 600_000))
        },
    ]
}

/// The statement inserting `g`, its ids numbered from `first`: `generate_series` on
/// PostgreSQL, a recursive CTE on SQLite.
fn fill(dialect: Dialect, runs: &str, g: &Group, first: i64) -> String {
    let (id, input) = match dialect {
        Dialect::Postgres => (
            format!(
                "CAST('00000000-0000-4000-8000-' || lpad(to_hex({first} + i), 12, '0') AS UUID)"
            ),
            "CAST('{}' AS JSONB)",
        ),
        _ => (
            format!("printf('00000000-0000-4000-8000-%012x', {first} + i)"),
            "'{}'",
        ),
    };
    let reason = if g.finished_at == "NULL" {
        "NULL"
    } else {
        "CASE i % 3 WHEN 1 THEN 'retries_exhausted' WHEN 2 THEN 'cancelled' ELSE NULL END"
    };
    let select = format!(
        "SELECT {id}, 'agent_' || (i % 10), {status}, {input}, {reason}, {claimed}, {lease}, 0, \
         {created}, {created}, {finished}, {created}, {due}",
        status = g.status,
        claimed = g.claimed_by,
        lease = g.lease_expires,
        created = g.created_at,
        finished = g.finished_at,
        due = g.due_at,
    );
    let insert = format!(
        "INSERT INTO {runs} (id, agent, status, input, termination_reason, claimed_by, \
         lease_expires, requeue_count, created_at, started_at, finished_at, updated_at, due_at)"
    );
    match dialect {
        Dialect::Postgres => format!("{insert} {select} FROM generate_series(1, {}) AS s(i)", g.n),
        _ => format!(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {}) \
             {insert} {select} FROM s",
            g.n
        ),
    }
}

/// The number of `$n` placeholders in a PostgreSQL statement.
fn placeholders(sql: &str) -> usize {
    sql.split('$')
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// Where a database reads for one statement, and whether that reads the runs table in full.
#[derive(Debug)]
struct Plan {
    /// One line per plan node.
    lines: Vec<String>,
    /// A node reading the runs table through an index.
    indexed: bool,
    /// Why the plan is refused: a full scan of the runs table or a sort.
    refused: Vec<String>,
}

/// SQLite's `EXPLAIN QUERY PLAN` of `sql` (unbound values are NULL; SQLite's plans do not
/// depend on them).
async fn explain_sqlite(pool: &sqlx::SqlitePool, runs: &str, sql: &str) -> Plan {
    use sqlx::Row as _;
    let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
        .fetch_all(pool)
        .await
        .unwrap();
    let lines: Vec<String> = rows.iter().map(|r| r.get::<String, _>("detail")).collect();
    let mut refused = Vec::new();
    let mut indexed = false;
    for line in &lines {
        let on_runs = line
            .strip_prefix("SCAN ")
            .or_else(|| line.strip_prefix("SEARCH "))
            .is_some_and(|rest| rest == runs || rest.starts_with(&format!("{runs} ")));
        if line.contains("TEMP B-TREE") {
            refused.push(format!("sort: {line}"));
        }
        if !on_runs {
            continue;
        }
        if line.contains(" INDEX ") || line.contains("PRIMARY KEY") {
            indexed = true;
        } else if line.starts_with("SCAN ") {
            refused.push(format!("full scan: {line}"));
        }
    }
    Plan {
        lines,
        indexed,
        refused,
    }
}

/// PostgreSQL's generic plan of `sql`, prepared on `conn`, as `EXPLAIN (FORMAT JSON)`.
async fn explain_postgres(conn: &mut sqlx::PgConnection, runs: &str, sql: &str) -> Plan {
    use sqlx::Row as _;
    sqlx::raw_sql(&format!("PREPARE scale_probe AS {sql}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let nulls = vec!["NULL"; placeholders(sql)].join(", ");
    let execute = if nulls.is_empty() {
        "EXECUTE scale_probe".to_owned()
    } else {
        format!("EXECUTE scale_probe({nulls})")
    };
    let row = sqlx::query(&format!("EXPLAIN (FORMAT JSON) {execute}"))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let json: serde_json::Value = row.get(0);
    sqlx::raw_sql("DEALLOCATE scale_probe")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut plan = Plan {
        lines: Vec::new(),
        indexed: false,
        refused: Vec::new(),
    };
    walk(&json[0]["Plan"], runs, 0, &mut plan);
    plan
}

fn walk(node: &serde_json::Value, runs: &str, depth: usize, plan: &mut Plan) {
    let field = |k: &str| node[k].as_str().unwrap_or_default();
    let (kind, relation, index) = (
        field("Node Type"),
        field("Relation Name"),
        field("Index Name"),
    );
    let line = format!(
        "{:indent$}{kind}{}{}{} (rows {})",
        "",
        if relation.is_empty() {
            String::new()
        } else {
            format!(" on {relation}")
        },
        if index.is_empty() {
            String::new()
        } else {
            format!(" using {index}")
        },
        node["Filter"]
            .as_str()
            .map(|f| format!(" filter {f}"))
            .unwrap_or_default(),
        node["Plan Rows"],
        indent = depth * 2
    );
    if relation == runs {
        match kind {
            "Index Scan" | "Index Only Scan" | "Bitmap Heap Scan" => plan.indexed = true,
            "Seq Scan" => plan.refused.push(format!("full scan: {line}")),
            _ => {}
        }
    }
    if kind == "Sort" || kind == "Incremental Sort" {
        plan.refused.push(format!("sort: {line}"));
    }
    plan.lines.push(line);
    for child in node["Plans"].as_array().into_iter().flatten() {
        walk(child, runs, depth + 1, plan);
    }
}

/// What the database plans for each distinct statement, by `explain`.
enum Explainer {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgConnection),
}

impl Explainer {
    async fn plan(&mut self, runs: &str, sql: &str) -> Plan {
        match self {
            Self::Sqlite(pool) => explain_sqlite(pool, runs, sql).await,
            Self::Postgres(conn) => explain_postgres(conn, runs, sql).await,
        }
    }
}

/// Prints each distinct statement of `ran` with its plan and time, and returns the refusals.
async fn check(what: &str, ran: &[statements::Ran], runs: &str, ex: &mut Explainer) -> Vec<String> {
    let mut seen: Vec<(&str, usize, f64)> = Vec::new();
    for r in ran {
        match seen.iter_mut().find(|(sql, _, _)| *sql == r.sql) {
            Some((_, n, secs)) => {
                *n += 1;
                *secs += r.secs;
            }
            None => seen.push((&r.sql, 1, r.secs)),
        }
    }
    let mut refused = Vec::new();
    for (sql, n, secs) in seen {
        let plan = ex.plan(runs, sql).await;
        let short: String = sql.chars().take(160).collect();
        println!("[{what}] {n}x, {:.2} ms in all: {short}", secs * 1000.0);
        for line in &plan.lines {
            println!("    {line}");
        }
        if !plan.indexed {
            refused.push(format!(
                "[{what}] no index on {runs}: {short}\n{:#?}",
                plan.lines
            ));
        }
        for r in plan.refused {
            refused.push(format!("[{what}] {r}: {short}"));
        }
    }
    refused
}

/// Times `f` and prints it.
async fn timed<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    let start = Instant::now();
    let out = f.await;
    println!("{what}: {:.2} ms", start.elapsed().as_secs_f64() * 1000.0);
    out
}

async fn reaper_pass_and_dashboard_pages_are_planned_on_indexes(fx: &Fixture, mut ex: Explainer) {
    let sql: &SqlRunStore = fx.sql().expect("a SQL store");
    let runs = sql.runs_table().to_owned();
    let dialect = sql.dialect();
    let now = fx.store.now_ms().await.unwrap();
    let start = Instant::now();
    let mut first = 0;
    let groups = groups(now);
    for g in &groups {
        sql.execute(&fill(dialect, &runs, g, first)).await.unwrap();
        first += g.n;
    }
    sql.execute(&match dialect {
        // What autovacuum does to a table loaded in bulk: statistics, and the visibility map
        // and hint bits, so that the first reads after the load do not write every page.
        Dialect::Postgres => format!("VACUUM ANALYZE {runs}"),
        _ => "ANALYZE".to_owned(),
    })
    .await
    .unwrap();
    println!(
        "{dialect:?}: {first} runs ({FINISHED} finished, {QUEUED} queued) filled in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    statements::install();

    let queue = InMemoryTransport::new();
    let runtime = Runtime::builder(fx.store.clone())
        .agent("scripted", courier_runs::ScriptedAgent)
        .build();
    let _bus = runtime
        .register(
            MessageBus::builder()
                .transport("async", std::sync::Arc::new(queue.clone()))
                .route("courier.run_agent", ["async"]),
        )
        .build();
    let reaper = runtime
        .reaper()
        .retention(Some(RETENTION))
        .redispatch_after(REDISPATCH_AFTER);

    let mark = statements::mark();
    let report = timed("reaper pass", reaper.reap(ReapOptions::default()))
        .await
        .unwrap();
    let limit = ReapOptions::default().limit;
    assert_eq!(
        (
            report.selected,
            report.requeued,
            report.redispatched,
            report.woken
        ),
        (10, 10, 10, 10),
        "{report:?}"
    );
    assert_eq!(report.pruned, limit as u64, "{report:?}");
    // The next pass finds nothing stale, overdue or due, and prunes the next batch.
    let report = timed("next reaper pass", reaper.reap(ReapOptions::default()))
        .await
        .unwrap();
    assert_eq!(
        (
            report.selected,
            report.redispatched,
            report.woken,
            report.pruned
        ),
        (0, 0, 0, limit as u64),
        "{report:?}"
    );
    let reap = statements::since(mark, &runs);

    // The runs list: the newest page, a page deep in the list both ways, filtered by status and
    // by agent; each reads one row more than it shows, as the dashboard does.
    let mark = statements::mark();
    let deep = RunCursor {
        created_at: now - 20 * DAY_MS,
        id: Uuid::max(),
    };
    let pages = [
        RunPageQuery::newest(51),
        RunPageQuery::newest(51).from(PageFrom::Before(deep)),
        RunPageQuery::newest(51).from(PageFrom::After(deep)),
        RunPageQuery::newest(51).status(RunStatus::Queued),
        RunPageQuery::newest(51)
            .status(RunStatus::Failed)
            .from(PageFrom::Before(deep)),
        RunPageQuery::newest(51).agent("agent_3"),
        RunPageQuery::newest(51)
            .agent("agent_3")
            .status(RunStatus::Completed)
            .from(PageFrom::Before(deep)),
    ];
    for q in &pages {
        let page = timed(&format!("runs page {q:?}"), fx.store.page(q))
            .await
            .unwrap();
        assert_eq!(page.len(), 51, "{q:?}");
    }
    // A rare status past its last run: only the status's own index knows at once that nothing
    // is left; walking every run older than the cursor and filtering finds it out last.
    let rare = RunPageQuery::newest(51)
        .status(RunStatus::Waiting)
        .from(PageFrom::Before(deep));
    let rare_mark = statements::mark();
    let page = timed(&format!("runs page {rare:?}"), fx.store.page(&rare))
        .await
        .unwrap();
    assert!(page.is_empty(), "{page:?}");
    let rare_page = statements::since(rare_mark, &runs);
    // A run's page: the run, its events and its steps.
    let id = fx.store.page(&pages[1]).await.unwrap()[0].id;
    timed("run page", async {
        assert!(fx.store.find(id).await.unwrap().is_some());
        fx.store.events(id).await.unwrap();
        fx.store.steps(id).await.unwrap();
    })
    .await;
    let dashboard = statements::since(mark, &runs);

    // The overview's counts read every run (one COUNT per status): timed and shown, not held to
    // the index rule.
    let mark = statements::mark();
    let counts = timed("overview counts", fx.store.count_by_status())
        .await
        .unwrap();
    println!("{counts:?}");
    let overview = statements::since(mark, &runs);

    let mut refused = check("reaper", &reap, &runs, &mut ex).await;
    refused.extend(check("dashboard", &dashboard, &runs, &mut ex).await);
    let _ = check("overview", &overview, &runs, &mut ex).await;
    let index = format!("{runs}_status_created_idx");
    let plan = ex.plan(&runs, &rare_page[0].sql).await;
    assert!(
        plan.lines.iter().any(|l| l.contains(&index)),
        "a page of one status seeks in the status index:\n{}",
        plan.lines.join("\n")
    );
    // The stale, overdue and due selects and the prune's, at least: the recorder saw the pass.
    assert!(
        reap.len() >= 4 && !dashboard.is_empty(),
        "statements recorded"
    );
    assert!(
        refused.is_empty(),
        "plans reading the runs table in full or sorting:\n{}",
        refused.join("\n")
    );
}

/// Runs the test on `fx`, dropping its tables whatever happens.
async fn at_scale(fx: Fixture, ex: Explainer) {
    let test = tokio::time::timeout(
        Duration::from_secs(600),
        reaper_pass_and_dashboard_pages_are_planned_on_indexes(&fx, ex),
    );
    let result = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(test)).await;
    fx.cleanup().await;
    match result {
        Ok(done) => done.expect("test timed out"),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fills 1,102,030 runs (half a minute): run with --include-ignored"]
async fn sqlite_reaper_pass_and_dashboard_pages_are_planned_on_indexes() {
    let dir = support::TempDir::new();
    let dsn = format!("sqlite://{}?mode=rwc", dir.0.join("runs.db").display());
    let pool = sqlx::SqlitePool::connect(&dsn).await.unwrap();
    let fx = support::sql(&dsn, Some(dir)).await;
    at_scale(fx, Explainer::Sqlite(pool)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs postgres: set COURIER_TEST_POSTGRES_URL"]
async fn postgres_reaper_pass_and_dashboard_pages_are_planned_on_indexes() {
    let url = courier_test::env::postgres_url();
    let conn = tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(&url))
        .await
        .expect("connect timed out")
        .unwrap();
    let mut conn = conn;
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await
        .unwrap();
    let fx = support::postgres().await;
    at_scale(fx, Explainer::Postgres(conn)).await;
}
