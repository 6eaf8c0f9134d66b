//! The dashboard's test fixture: SQLite transports (`async`, with failure transport `failed`)
//! and a SQLite run store in a temp dir, seeded with runs (events included) of every kind and
//! failed messages, one of which carries a `<script>` in its body.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use courier_core::config::{Config, Transports};
use courier_core::{
    Envelope, ErrorDetailsStamp, Message, MessageRegistry, RedeliveryStamp,
    SentToFailureTransportStamp, TransportRegistry,
};
use courier_dashboard::{Dashboard, DashboardOptions};
use courier_runs::{
    FailureClass, NewRun, RunStatus, RunStore, Settlement, SqlRunStore, SqlRunStoreOptions,
    TerminationReason,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The body that must be shown as text, never run.
pub const SCRIPT_TEXT: &str = "<script>window.__pwned = 1</script> hello";

/// A message of the test application.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Note {
    pub text: String,
}

impl Message for Note {
    const NAME: &'static str = "app.note";
}

/// What was seeded.
#[derive(Debug)]
pub struct Seeded {
    /// Every run, in creation order.
    pub runs: Vec<Uuid>,
    /// A run that is running, under a lease, with events.
    pub running: Uuid,
    /// A run that failed after events.
    pub failed_run: Uuid,
    /// The id of the failed message whose body holds [`SCRIPT_TEXT`].
    pub script_message: String,
    /// The other failed messages' ids, with their texts.
    pub messages: Vec<(String, String)>,
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub transports: Transports,
    pub store: Arc<SqlRunStore>,
    pub seeded: Seeded,
}

pub fn registry() -> MessageRegistry {
    let mut r = MessageRegistry::new();
    r.register::<Note>();
    r
}

impl Fixture {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("courier.db");
        let config: Config = format!(
            "[transports.async]\ndsn = \"sqlite://{db}\"\nfailure_transport = \"failed\"\n\
             [transports.failed]\ndsn = \"sqlite://{db}?queue_name=failed\"\n",
            db = db.display()
        )
        .parse()
        .unwrap();
        let factories = TransportRegistry::new().with(Arc::new(courier_sql::SqlTransportFactory));
        let transports = tokio::time::timeout(
            Duration::from_secs(20),
            config.connect(&factories, Arc::new(registry())),
        )
        .await
        .expect("connect timed out")
        .unwrap();
        for t in transports.all().values() {
            if let Some(s) = t.as_setup() {
                s.setup().await.unwrap();
            }
        }
        let store = SqlRunStore::connect(
            &format!("sqlite://{}?mode=rwc", db.display()),
            SqlRunStoreOptions::default(),
        )
        .await
        .unwrap();
        store.setup().await.unwrap();
        let store = Arc::new(store);
        let seeded = seed(&store, &transports).await;
        Self {
            dir,
            transports,
            store,
            seeded,
        }
    }

    pub fn dashboard(&self, options: DashboardOptions) -> Dashboard {
        Dashboard::new(self.transports.clone(), self.store.clone(), options)
    }
}

async fn new_run(store: &SqlRunStore, agent: &str, input: serde_json::Value) -> Uuid {
    let id = Uuid::new_v4();
    store
        .insert_queued(&NewRun {
            id,
            agent: agent.into(),
            input,
            budget: None,
            concurrency_key: None,
        })
        .await
        .unwrap();
    id
}

const WORKER: &str = "worker:build-7:4242:a1b2c3";

async fn claim_with_steps(store: &SqlRunStore, id: Uuid, steps: &[(&str, serde_json::Value)]) {
    store
        .claim(id, WORKER, Duration::from_secs(900))
        .await
        .unwrap()
        .expect("claimed");
    for (kind, payload) in steps {
        store.append_event(id, kind, payload).await.unwrap();
    }
}

/// Spreads the runs over the last quarter of an hour, in creation order (newest last), each
/// step a few seconds after the one before, as a real day's runs would be.
async fn backdate(store: &SqlRunStore, runs: &[Uuid]) {
    let n = runs.len();
    for (i, id) in runs.iter().enumerate() {
        let shift = i64::try_from((n - i) * 83_000).unwrap();
        let events = store.events(*id).await.unwrap().len();
        let done = 2_500 + (i64::try_from(events).unwrap() + 1) * 3_700;
        let (runs_table, events_table) = (store.runs_table(), store.events_table());
        store
            .execute(&format!(
                "UPDATE {runs_table} SET created_at = created_at - {shift}, \
                 started_at = started_at - {shift} + 2500, \
                 finished_at = finished_at - {shift} + {done}, \
                 updated_at = CASE WHEN started_at IS NULL THEN updated_at - {shift} \
                     ELSE updated_at - {shift} + {done} END, \
                 due_at = due_at - {shift} WHERE id = '{id}'"
            ))
            .await
            .unwrap();
        store
            .execute(&format!(
                "UPDATE {events_table} SET created_at = created_at - {shift} + 2500 + seq * 3700 \
                 WHERE run_id = '{id}'"
            ))
            .await
            .unwrap();
    }
}

async fn seed(store: &SqlRunStore, transports: &Transports) -> Seeded {
    use serde_json::json;
    let mut runs = Vec::new();
    let docs = [
        "invoice-2041.pdf",
        "contract-88.docx",
        "report-q3.pdf",
        "notes.md",
    ];
    // Completed runs with a few steps each.
    for (i, doc) in docs.iter().enumerate() {
        let id = new_run(store, "summarize", json!({ "document": doc })).await;
        claim_with_steps(
            store,
            id,
            &[
                (
                    "fetch",
                    json!({ "document": doc, "bytes": 18_000 + i * 1_000 }),
                ),
                (
                    "llm_call",
                    json!({ "model": "small", "tokens": 900 + i * 37 }),
                ),
                (
                    "output",
                    json!({ "summary": format!("{doc}: three key points") }),
                ),
            ],
        )
        .await;
        let settled = store
            .settle(
                id,
                Some(WORKER),
                &Settlement {
                    status: RunStatus::Completed,
                    reason: Some(TerminationReason::Completed),
                    class: None,
                    output: Some(json!({ "summary": format!("{doc}: three key points") })),
                },
            )
            .await
            .unwrap();
        assert!(settled);
        runs.push(id);
    }
    // A failed run.
    let failed_run = new_run(
        store,
        "translate",
        json!({ "text": "Guten Tag", "to": "en" }),
    )
    .await;
    claim_with_steps(
        store,
        failed_run,
        &[
            ("llm_call", json!({ "model": "large", "attempt": 1 })),
            (
                "error",
                json!({ "status": 503, "message": "upstream overloaded" }),
            ),
        ],
    )
    .await;
    store
        .settle(
            failed_run,
            Some(WORKER),
            &Settlement::failed(
                TerminationReason::RetriesExhausted,
                Some(FailureClass::ServerError),
            ),
        )
        .await
        .unwrap();
    runs.push(failed_run);
    // Queued, cancelled, waiting runs.
    for agent in ["classify", "classify", "translate"] {
        runs.push(new_run(store, agent, json!({ "ticket": 1187 })).await);
    }
    let cancelled = new_run(store, "summarize", json!({ "document": "draft.txt" })).await;
    store.cancel(cancelled).await.unwrap();
    runs.push(cancelled);
    // A running run, last: the newest.
    let running = new_run(store, "summarize", json!({ "document": "handbook.pdf" })).await;
    claim_with_steps(
        store,
        running,
        &[
            (
                "fetch",
                json!({ "document": "handbook.pdf", "bytes": 412_000 }),
            ),
            ("llm_call", json!({ "model": "small", "chunk": 1, "of": 4 })),
        ],
    )
    .await;
    store
        .renew(running, WORKER, Duration::from_secs(900))
        .await
        .unwrap();
    runs.push(running);

    backdate(store, &runs).await;

    // Failed messages: moved from `async` after their retries.
    let failed = transports.get("failed").unwrap();
    let mut messages = Vec::new();
    let texts = [
        (
            "send welcome mail to ada@example.com",
            "recoverable",
            "smtp: connection refused",
        ),
        (
            "resize avatar 31",
            "unrecoverable",
            "image decoder: unsupported format",
        ),
        (
            "sync crm contact 77",
            "recoverable",
            "crm api: 429 too many requests",
        ),
    ];
    let mut script_message = String::new();
    for (i, (text, class, error)) in texts
        .iter()
        .copied()
        .chain([(SCRIPT_TEXT, "unrecoverable", "template: <b>bad</b> markup")])
        .enumerate()
    {
        let envelope = Envelope::new(Note { text: text.into() })
            .with(RedeliveryStamp::new(3))
            .with_error_details(ErrorDetailsStamp::new(
                class,
                error,
                vec![format!("cause {i}")],
            ))
            .with(SentToFailureTransportStamp::new("async"));
        let sent = failed.send(envelope).await.unwrap();
        let id = sent.id().unwrap().to_owned();
        if text == SCRIPT_TEXT {
            script_message = id;
        } else {
            messages.push((id, text.to_owned()));
        }
    }
    Seeded {
        runs,
        running,
        failed_run,
        script_message,
        messages,
    }
}
