//! Courier inside an existing web service: an axum app on its own SQLite pool, with the Courier
//! worker and the runs reaper in the same process, on the same pool, under one shutdown signal.
//!
//! - `POST /orders {"item": "tea"}` writes the order and dispatches `OrderPlaced` in one
//!   transaction of the app's pool (the outbox: the message exists if and only if the order does).
//! - The worker, beside the server, handles `OrderPlaced`: it confirms the order and enqueues a
//!   durable run that mails the receipt (a crash mid-run is picked up by the reaper).
//! - `GET /orders/{id}` shows the order's status: `placed`, `confirmed`, `receipt_sent`.
//! - SIGTERM or Ctrl-C: the server stops accepting connections and finishes its requests, the
//!   worker finishes the messages it holds within the grace period, the reaper stops; exit 0.
//!
//! ```sh
//! cargo run --example axum_service                  # self-check: one order end to end, then drain
//! cargo run --example axum_service -- --serve [--addr 127.0.0.1:8080] [--db shop.db]
//! curl -X POST 127.0.0.1:8080/orders -H 'content-type: application/json' -d '{"item":"tea"}'
//! ```
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use courier::runs::{
    Agent, AgentError, AgentOutcome, ReapOptions, RunAgent, RunContext, Runtime, SqlRunStore,
    SqlRunStoreOptions, Step, UniqueKey,
};
use courier::sql::{SqlOptions, SqlTransport, dispatch_in};
use courier::{
    CancellationToken, Envelope, Handler, HandlerError, HandlerResultExt, Message, MessageBus,
    MessageRegistry, Worker, async_trait,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the worker's in-flight messages may take to finish once a stop is asked for. Keep it
/// under the orchestrator's own (Kubernetes sends SIGKILL 30 s after SIGTERM by default).
const GRACE: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order: i64,
}

impl Message for OrderPlaced {
    const NAME: &'static str = "shop.order_placed";
}

// ---- the web side ------------------------------------------------------------------------

/// What every request handler gets: the app's own pool, and the bus to dispatch on.
#[derive(Clone)]
struct AppState {
    pool: SqlitePool,
    bus: MessageBus,
}

#[derive(Deserialize)]
struct NewOrder {
    item: String,
}

type ApiResult = Result<(StatusCode, Json<Value>), (StatusCode, String)>;

fn internal(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

async fn place_order(State(app): State<AppState>, Json(new): Json<NewOrder>) -> ApiResult {
    // One transaction of the app's pool holds the order and its message: if anything fails
    // before the commit, neither exists, and no worker ever sees an order that was not saved.
    let mut tx = app.pool.begin().await.map_err(internal)?;
    let order: i64 =
        sqlx::query_scalar("INSERT INTO orders (item, status) VALUES (?, 'placed') RETURNING id")
            .bind(&new.item)
            .fetch_one(&mut *tx)
            .await
            .map_err(internal)?;
    dispatch_in(&app.bus, &mut tx, OrderPlaced { order })
        .await
        .map_err(internal)?;
    tx.commit().await.map_err(internal)?;
    Ok((StatusCode::CREATED, Json(json!({ "order": order }))))
}

async fn show_order(State(app): State<AppState>, Path(order): Path<i64>) -> ApiResult {
    let status: Option<String> = sqlx::query_scalar("SELECT status FROM orders WHERE id = ?")
        .bind(order)
        .fetch_optional(&app.pool)
        .await
        .map_err(internal)?;
    match status {
        Some(status) => Ok((
            StatusCode::OK,
            Json(json!({ "order": order, "status": status })),
        )),
        None => Err((StatusCode::NOT_FOUND, format!("no order {order}"))),
    }
}

// ---- the background side -----------------------------------------------------------------

/// Handles `OrderPlaced` in the worker: confirms the order, then hands the receipt to a durable
/// run. Messages are delivered at least once, so both steps are safe to repeat: the update is
/// idempotent and the run is unique per order.
struct ConfirmOrder {
    pool: SqlitePool,
    runtime: Runtime,
}

#[async_trait]
impl Handler<OrderPlaced> for ConfirmOrder {
    async fn handle(&self, m: &OrderPlaced, _: &Envelope) -> Result<(), HandlerError> {
        sqlx::query("UPDATE orders SET status = 'confirmed' WHERE id = ? AND status = 'placed'")
            .bind(m.order)
            .execute(&self.pool)
            .await
            .recoverable()?;
        println!("order {} confirmed", m.order);
        let once = UniqueKey::new(format!("receipt:{}", m.order), Duration::from_secs(86_400))
            .unrecoverable()?;
        self.runtime
            .enqueue_unique("send_receipt", json!({ "order": m.order }), once)
            .await
            .recoverable()?;
        Ok(())
    }
}

/// Mails an order's receipt: a durable run, claimed under a lease; if the process dies mid-run,
/// the reaper (in this process or another) requeues it once the lease runs out.
struct SendReceipt {
    pool: SqlitePool,
}

#[async_trait]
impl Agent for SendReceipt {
    async fn run(&self, cx: &mut RunContext) -> Result<AgentOutcome, AgentError> {
        let order = cx.input()["order"].as_i64().unwrap_or_default();
        cx.checkpoint(Step::new("render", json!({ "order": order })))
            .await?;
        // (a real app would call its mail provider here)
        sqlx::query("UPDATE orders SET status = 'receipt_sent' WHERE id = ?")
            .bind(order)
            .execute(&self.pool)
            .await
            .map_err(AgentError::other)?;
        println!("receipt for order {order} sent");
        Ok(AgentOutcome::Completed(json!({ "order": order })))
    }
}

// ---- wiring --------------------------------------------------------------------------------

/// Runs the service until `shutdown` is cancelled, then drains it; `ready` gets the address once
/// it listens.
async fn serve(
    db: PathBuf,
    addr: SocketAddr,
    shutdown: CancellationToken,
    ready: tokio::sync::oneshot::Sender<SocketAddr>,
) -> anyhow::Result<()> {
    // The app's pool: Courier's queue, its run store and the app's own queries share these
    // connections (one budget to size), and `dispatch_in` needs the queue on this very pool.
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&db)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5)),
        )
        .await
        .with_context(|| format!("opening {}", db.display()))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders \
         (id INTEGER PRIMARY KEY, item TEXT NOT NULL, status TEXT NOT NULL)",
    )
    .execute(&pool)
    .await?;

    // Courier on that pool. Both create their tables here; a team that runs its schema through
    // its own migrations takes the DDL from `courier setup --print-sql` and turns auto_setup off.
    // The transport decodes what it reads with this registry: the app's messages, and the
    // runtime's (a run travels as a `RunAgent` carrying its id).
    let registry = Arc::new(
        MessageRegistry::new()
            .with::<OrderPlaced>()
            .with::<RunAgent>(),
    );
    let jobs = Arc::new(
        SqlTransport::from_pool("jobs", pool.clone(), SqlOptions::default(), registry).await?,
    );
    let store = SqlRunStore::from_pool(pool.clone(), SqlRunStoreOptions::default())?;
    store.migrate().await?;
    let runtime = Runtime::builder(Arc::new(store))
        .agent("send_receipt", SendReceipt { pool: pool.clone() })
        .build();

    // One bus for both sides: request handlers dispatch on it, the worker handles on it, and
    // the runtime dispatches its runs' messages on it (`register`).
    let bus = runtime
        .register(
            MessageBus::builder()
                .transport("jobs", jobs.clone())
                .route("shop.*", ["jobs"])
                .route("courier.run_agent", ["jobs"])
                .handler(ConfirmOrder {
                    pool: pool.clone(),
                    runtime: runtime.clone(),
                }),
        )
        .build();

    let app = Router::new()
        .route("/orders", post(place_order))
        .route("/orders/{id}", get(show_order))
        .with_state(AppState {
            pool: pool.clone(),
            bus: bus.clone(),
        });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let _ = ready.send(addr);

    // The three share one token: cancelling it (the signal handler does) stops them all.
    // axum stops accepting and lets in-flight requests finish (their orders and messages are
    // committed, and handled at the next start if the worker is gone by then); the worker stops
    // fetching, releases what it fetched but did not start, and gives in-flight handlers GRACE.
    let server =
        axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let worker = Worker::builder(bus)
        .receiver("jobs", jobs)
        .grace(GRACE)
        .build();
    let reaper = runtime.reaper();
    let (served, worked, ()) = tokio::join!(
        async { server.await },
        worker.run(shutdown.clone()),
        reaper.run_every(
            Duration::from_secs(5),
            ReapOptions::default(),
            shutdown.clone()
        ),
    );
    served?;
    let stats = worked?;
    println!("drained: {} message(s) handled", stats.handled);

    // The pool is the app's: Courier never closes it, the app does, once everything is done.
    pool.close().await;
    Ok(())
}

/// Cancels `shutdown` at the first SIGTERM (what orchestrators send) or Ctrl-C.
async fn stop_on_signal(shutdown: CancellationToken) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    println!("stopping: no new requests, draining the worker (grace {GRACE:?})");
    shutdown.cancel();
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut serve_mode, mut addr, mut db) = (false, SocketAddr::from(([127, 0, 0, 1], 0)), None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve" => serve_mode = true,
            "--addr" => addr = args.next().context("--addr ADDR")?.parse()?,
            "--db" => db = Some(PathBuf::from(args.next().context("--db PATH")?)),
            other => anyhow::bail!("unknown argument {other} (--serve, --addr ADDR, --db PATH)"),
        }
    }
    let dir = tempfile::tempdir()?;
    let db = db.unwrap_or_else(|| dir.path().join("shop.db"));
    let shutdown = CancellationToken::new();
    let (ready, listening) = tokio::sync::oneshot::channel();

    if serve_mode {
        tokio::spawn(stop_on_signal(shutdown.clone()));
        return serve(db, addr, shutdown, ready).await;
    }

    // Self-check (what scripts/test runs): start, place one order over HTTP, wait until the
    // worker confirmed it and the run sent its receipt, then stop as a signal would.
    let service = tokio::spawn(serve(db, addr, shutdown.clone(), ready));
    let addr = listening.await.context("the service did not start")?;
    let (status, body) = http(addr, "POST", "/orders", r#"{"item":"tea"}"#).await?;
    anyhow::ensure!(status == 201, "POST /orders answered {status}: {body}");
    let order = serde_json::from_str::<Value>(&body)?["order"].clone();
    let path = format!("/orders/{order}");
    let done = async {
        loop {
            let (_, body) = http(addr, "GET", &path, "").await?;
            if body.contains("receipt_sent") {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), done)
        .await
        .context("the order was not handled within 30 s")??;
    shutdown.cancel();
    service.await??;
    println!("self-check passed");
    Ok(())
}

/// A one-shot HTTP/1.1 request (enough for the self-check; use a real client in an app).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("not an HTTP response")?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}
