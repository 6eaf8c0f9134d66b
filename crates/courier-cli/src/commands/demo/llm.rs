//! `courier demo --agent llm` (feature `agent`): LLM agent runs on durable steps against an
//! OpenAI-compatible test server started in this process on 127.0.0.1
//! ([`courier_agent::testing::TestServer`]), with scripted answers: tool calls, a 429 (with
//! `Retry-After`) from both providers, a 503 then the fallback provider, a slow answer.
//!
//! The agent `courier-demo-llm` (two providers, `primary` and `fallback`, a breaker in the run
//! store's database, the tools of [`super::llm_tools::tools`]) is written into the workers'
//! configuration; the worker processes are this binary running `consume demo`, as in the
//! scripted demo. One long run asks for a slow tool twice: when it has journaled a model step
//! asking for it, the demo SIGKILLs the worker running it; a surviving worker's reaper requeues
//! it and a worker resumes it. The summary shows, from the server's own record of the calls
//! (each carries its model step's `Idempotency-Key`, `RUN:INDEX`), that no finished model step
//! was called again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier_agent::testing::{Call, Reply, Request, TestServer, answer, tool_call};
use courier_agent::{BreakerStore, LazySqlBreakers};
use courier_core::MessageRegistry;
use courier_core::config::Config;
use courier_runs::{RunAgent, RunStatus, RunStore, RunsConfig, StepStatus};
use serde_json::json;

use super::llm_tools::AGENT;
use super::summary::{self, KilledWorker};
use super::workers::{self, WorkDir, Workers};
use super::{Crash, Out, Watch, drive, find, pids, short};
use crate::cli::{Cli, DemoArgs, Format};
use crate::error::{CliError, CliResult, chain};
use crate::wiring::Wiring;

/// Runs submitted without --runs.
const DEFAULT_RUNS: u32 = 12;
/// How long the scripted slow answer takes (well within the provider's timeout).
const SLOW_ANSWER: Duration = Duration::from_millis(800);
/// The longest the demo waits for a worker to be running the long run's slow tool.
const CRASH_DEADLINE: Duration = Duration::from_secs(40);

/// What run `i` exercises (its prompt carries it, so the server knows what to answer).
fn scenario(i: u32) -> &'static str {
    match (i, i % 4) {
        (0, _) => "crash",
        (_, 1) => "503",
        (_, 2) => "429",
        (_, 3) => "slow",
        _ => "plain",
    }
}

fn prompt(i: u32) -> String {
    format!("[{}] Where is order A-{i}?", scenario(i))
}

/// The server's script: by the prompt's scenario, the model turn, the provider and how often this
/// provider saw the step's key.
fn reply(req: &Request) -> Reply {
    let prompt = req.prompt().unwrap_or("");
    let scenario = prompt
        .strip_prefix('[')
        .and_then(|p| p.split_once(']'))
        .map_or("", |(s, _)| s);
    let order = prompt
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .trim_end_matches('?')
        .to_owned();
    let (turn, primary) = (req.turn(), req.provider == "primary");
    let args = json!({ "order": order });
    let normal = || match (scenario, turn) {
        (_, 1) => tool_call("call_1", "order_status", &args, 120, 18),
        ("crash", 2 | 3) => tool_call(&format!("call_{turn}"), "wait_for_courier", &args, 150, 20),
        _ => answer(&format!("Order {order} has shipped."), 160, 9),
    };
    match (scenario, turn, primary, req.attempt) {
        ("503", 1, true, _) => Reply::Status {
            status: 503,
            retry_after: None,
        },
        ("429", 1, _, 1) => Reply::Status {
            status: 429,
            retry_after: Some(1),
        },
        ("slow", 1, true, _) => Reply::Slow(SLOW_ANSWER, normal()),
        _ => Reply::Json(normal()),
    }
}

/// The workers' configuration: the scripted demo's, and the agent on the test server.
fn config(db: &str, server: &TestServer) -> String {
    format!(
        r#"{base}
[agents.{AGENT}]
system = "You answer questions about orders."
max_turns = 6
breaker = {{ failures = 3, window = "60s", cooldown = "1s" }}

[[agents.{AGENT}.providers]]
name = "primary"
base_url = "{primary}"
model = "big-model"
timeout = "5s"

[[agents.{AGENT}.providers]]
name = "fallback"
base_url = "{fallback}"
model = "small-model"
timeout = "5s"

[agents.{AGENT}.prices.big-model]
input = 2500000
output = 10000000

[agents.{AGENT}.prices.small-model]
input = 150000
output = 600000
"#,
        base = workers::config(db),
        primary = server.base_url("primary"),
        fallback = server.base_url("fallback"),
    )
}

/// The server's calls, as the summary shows them.
#[derive(Debug, Default, serde::Serialize)]
struct ServerFigures {
    /// Every call the server received.
    calls: usize,
    /// By provider.
    by_provider: BTreeMap<String, usize>,
    /// By the status it answered.
    by_status: BTreeMap<u16, usize>,
    /// Calls answered 200: model steps that ran (each journals one).
    answered: usize,
}

impl ServerFigures {
    fn of(calls: &[Call]) -> Self {
        let mut f = Self {
            calls: calls.len(),
            ..Self::default()
        };
        for c in calls {
            *f.by_provider.entry(c.provider.clone()).or_default() += 1;
            *f.by_status.entry(c.status).or_default() += 1;
        }
        f.answered = f.by_status.get(&200).copied().unwrap_or(0);
        f
    }
}

/// The killed worker's run, as the server saw it.
#[derive(Debug, Default, serde::Serialize)]
struct KilledRunCalls {
    /// Model steps it had journaled when its worker was killed.
    model_steps_before_kill: usize,
    /// Model steps journaled after the kill (ran by the worker that resumed it).
    model_steps_ran_after: usize,
    /// The server's calls for this run before the kill.
    server_calls_before_kill: usize,
    /// The server's calls for this run after the kill.
    server_calls_after_kill: usize,
    /// Calls after the kill carrying the key of a model step finished before it (0: none was
    /// paid for twice).
    calls_again_for_finished_steps: usize,
}

/// One provider's breaker, read back from the run store's database.
#[derive(Debug, serde::Serialize)]
struct Breaker {
    provider: String,
    state: String,
    failures: u32,
    opened_at: i64,
}

/// The summary: the scripted demo's figures, and the LLM ones.
#[derive(Debug, serde::Serialize)]
struct LlmSummary {
    agent: &'static str,
    #[serde(flatten)]
    runs: summary::Summary,
    /// Steps named `model` in every run's journal.
    model_steps_journaled: usize,
    /// Steps named `tool:*` in every run's journal.
    tool_steps_journaled: usize,
    /// Runs whose journal has a model step answered by the fallback provider.
    runs_answered_by_fallback: usize,
    server: ServerFigures,
    killed_run: KilledRunCalls,
    breakers: Vec<Breaker>,
}

pub(crate) async fn run(app: &Wiring, cli: &Cli, args: &DemoArgs) -> CliResult {
    let out = Out::new(cli.format == Format::Text && !cli.quiet);
    let db = args
        .db
        .clone()
        .unwrap_or_else(|| PathBuf::from("courier.db"));
    let db_text = db.display().to_string();
    let server = TestServer::start(reply).await.map_err(|e| {
        CliError::runtime(format!("cannot start the test server on 127.0.0.1: {e}"))
    })?;

    let config_text = config(&db_text, &server);
    let config: Config = config_text
        .parse()
        .map_err(|e| CliError::usage(format!("--db `{db_text}`: {e}")))?;
    let runs_config: RunsConfig = config
        .runs
        .clone()
        .unwrap_or_default()
        .deserialize()
        .map_err(|e| CliError::runtime(format!("[runs]: {e}")))?;
    let transports = config
        .connect(
            &app.factories,
            Arc::new(MessageRegistry::new().with::<RunAgent>()),
        )
        .await?;
    for t in transports.all().values() {
        if let Some(setup) = t.as_setup() {
            setup.setup().await?;
        }
    }
    let store = crate::runs::open_store(&runs_config).await?;
    let store_dsn = crate::runs::store_dsn(runs_config.store.as_deref());
    let table =
        config.agents.0.get(AGENT).ok_or_else(|| {
            CliError::runtime(format!("no [agents.{AGENT}] in the demo's config"))
        })?;
    let mut agents = app.agents.clone();
    agents.insert(
        AGENT,
        Arc::new(crate::agents::build(AGENT, table, &store_dsn)?),
    );
    let control = crate::runs::build_runtime(&agents, &runs_config, store.clone());
    let _bus = control.register(transports.bus_builder()).build();

    let started = Instant::now();
    let n = args.runs.unwrap_or(DEFAULT_RUNS);
    let mut ids = Vec::with_capacity(n as usize);
    for i in 0..n {
        let id = control
            .enqueue(AGENT, json!({ "prompt": prompt(i) }))
            .await
            .map_err(|e| CliError::runtime(format!("cannot submit run {i}: {}", chain(&e))))?;
        ids.push(id);
    }

    let work = WorkDir::create(&config_text)?;
    let mut workers = Workers::start(&work, args.workers)?;
    out.note(&format!(
        "Test server on {} (providers `primary` and `fallback`).\n\
         Submitted {} LLM agent runs to {db_text}; started {} worker processes ({}).",
        server.addr(),
        ids.len(),
        args.workers,
        pids(&workers.pids()),
    ));

    let mut watch = Watch {
        run: ids[0],
        started,
        killed: None,
        reaped: 0,
    };
    let mut crash = SlowTool {
        server: &server,
        kill: KillPoint::default(),
    };
    let driven = drive(&out, &store, &ids, &mut watch, &mut crash, &mut workers).await;
    let kill = crash.kill;
    let elapsed = started.elapsed();
    let worker_pids = workers.pids();
    let registry = transports
        .get("demo")
        .cloned()
        .and_then(courier_core::shared_worker_registry);
    let stopped = workers.stop(&work, registry).await;
    driven?;
    for line in stopped? {
        watch.line(&out, &line);
    }

    let mut runs = summary::summarise(&store, &ids, args.workers, elapsed).await?;
    runs.reaped = watch.reaped;
    runs.demo_pid = std::process::id();
    runs.worker_pids = worker_pids;
    let killed = watch
        .killed
        .take()
        .ok_or_else(|| CliError::runtime("no worker was killed"))?;
    let calls = server.calls();
    let mut s = LlmSummary {
        agent: "llm",
        runs,
        model_steps_journaled: 0,
        tool_steps_journaled: 0,
        runs_answered_by_fallback: 0,
        server: ServerFigures::of(&calls),
        killed_run: KilledRunCalls::default(),
        breakers: Vec::new(),
    };
    for id in &ids {
        let steps = store
            .steps(*id)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?;
        let model: Vec<_> = steps.iter().filter(|s| s.name == "model").collect();
        s.model_steps_journaled += model.len();
        s.tool_steps_journaled += steps.iter().filter(|s| s.name.starts_with("tool:")).count();
        if model
            .iter()
            .any(|s| s.output.as_ref().and_then(|o| o.get("provider")) == Some(&json!("fallback")))
        {
            s.runs_answered_by_fallback += 1;
        }
    }
    s.killed_run = kill.figures(&store, &killed, &calls).await?;
    let mut killed = killed;
    summary::Summary::resumed(&store, &mut killed).await?;
    s.runs.killed(killed);
    let breakers = LazySqlBreakers::new(store_dsn, None);
    s.breakers = breakers
        .rows()
        .await
        .map_err(|e| CliError::runtime(format!("reading the breakers: {e}")))?
        .into_iter()
        .map(|r| Breaker {
            provider: r.provider,
            state: r.state.as_str().to_owned(),
            failures: r.failures,
            opened_at: r.opened_at,
        })
        .collect();

    if cli.format == Format::Json {
        let text =
            serde_json::to_string_pretty(&s).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{text}");
    } else {
        print!("{}", render(&s, &db_text));
    }
    Ok(())
}

/// Where the long run stood when its worker was killed.
#[derive(Debug, Default)]
struct KillPoint {
    /// The keys (`RUN:INDEX`) of the model steps it had finished.
    finished_model_keys: BTreeSet<String>,
    /// The server's calls (all runs) at that moment.
    calls_before: usize,
}

impl KillPoint {
    async fn figures(
        &self,
        store: &Arc<dyn RunStore>,
        killed: &KilledWorker,
        calls: &[Call],
    ) -> CliResult<KilledRunCalls> {
        let run = killed.run_id.to_string();
        let of_run = |c: &&Call| {
            c.idempotency_key
                .as_deref()
                .and_then(|k| k.split_once(':'))
                .is_some_and(|(r, _)| r == run)
        };
        let before = calls[..self.calls_before.min(calls.len())]
            .iter()
            .filter(of_run)
            .count();
        let after: Vec<&Call> = calls[self.calls_before.min(calls.len())..]
            .iter()
            .filter(of_run)
            .collect();
        let model_steps = store
            .steps(killed.run_id)
            .await
            .map_err(|e| CliError::runtime(chain(&e)))?
            .iter()
            .filter(|s| s.name == "model" && s.status == StepStatus::Done)
            .count();
        Ok(KilledRunCalls {
            model_steps_before_kill: self.finished_model_keys.len(),
            model_steps_ran_after: model_steps.saturating_sub(self.finished_model_keys.len()),
            server_calls_before_kill: before,
            server_calls_after_kill: after.len(),
            calls_again_for_finished_steps: after
                .iter()
                .filter(|c| {
                    c.idempotency_key
                        .as_ref()
                        .is_some_and(|k| self.finished_model_keys.contains(k))
                })
                .count(),
        })
    }
}

/// The LLM demo's crash: the worker running the long run is killed once it runs its slow tool.
struct SlowTool<'a> {
    server: &'a TestServer,
    kill: KillPoint,
}

impl Crash for SlowTool<'_> {
    async fn try_kill(
        &mut self,
        out: &Out,
        store: &Arc<dyn RunStore>,
        watch: &mut Watch,
        workers: &mut Workers,
    ) -> CliResult {
        try_kill(out, store, self.server, watch, &mut self.kill, workers).await
    }
}

/// Kills the worker running the long run once its last finished step is a model step after the
/// first tool call: the worker is then in `wait_for_courier`, no model call in flight.
async fn try_kill(
    out: &Out,
    store: &Arc<dyn RunStore>,
    server: &TestServer,
    watch: &mut Watch,
    kill: &mut KillPoint,
    workers: &mut Workers,
) -> CliResult {
    let run = find(store, watch.run).await?;
    let owner = run.claimed_by.clone().unwrap_or_default();
    let pid = workers::pid_of(&owner).filter(|pid| workers.contains(*pid));
    let Some(pid) = pid.filter(|_| run.status == RunStatus::Running) else {
        if run.status.is_terminal() || watch.started.elapsed() > CRASH_DEADLINE {
            return Err(CliError::runtime(format!(
                "run {} was not seen in its slow tool under a demo worker (status {}, claimed by {})",
                watch.run,
                run.status.as_str(),
                run.claimed_by.as_deref().unwrap_or("nobody")
            )));
        }
        return Ok(());
    };
    let steps = store
        .steps(watch.run)
        .await
        .map_err(|e| CliError::runtime(chain(&e)))?;
    let done: Vec<_> = steps
        .iter()
        .filter(|s| s.status == StepStatus::Done)
        .collect();
    if done.len() < 3 || done.last().is_none_or(|s| s.name != "model") {
        return Ok(());
    }
    let status = workers.kill(pid).await?;
    // The server's record at the kill: the dead worker sends nothing more.
    kill.calls_before = server.calls().len();
    kill.finished_model_keys = done
        .iter()
        .filter(|s| s.name == "model")
        .map(|s| format!("{}:{}", watch.run, s.index))
        .collect();
    let killed_at_s = watch.at();
    let signal = workers::signal(status);
    out.note(&format!(
        "{killed_at_s:>5.1}s  killed worker {pid} ({}) in its tool `wait_for_courier`, \
         {} steps into run {} ({} model calls answered)",
        signal.map_or_else(|| "killed".to_owned(), |n| format!("exit: signal {n}")),
        done.len(),
        short(watch.run),
        kill.finished_model_keys.len(),
    ));
    watch.killed = Some(KilledWorker {
        pid,
        signal,
        worker_id: owner,
        run_id: watch.run,
        steps_before_kill: done.len(),
        steps_replayed: 0,
        steps_ran_after: 0,
        killed_at_s,
        reaped_at_s: None,
        reaped_by_pid: None,
        finished_at_s: None,
        finished_status: None,
        finished_by_pid: None,
    });
    Ok(())
}

fn render(s: &LlmSummary, db: &str) -> String {
    let base =
        summary::render(&s.runs, db).replace("scripted runs on SQLite", "LLM agent runs on SQLite");
    let mut out = String::new();
    let mut line =
        |label: &str, value: String| out.push_str(&format!("  {label:<48}{value:>10}\n"));
    line(
        "model steps journaled (all runs)",
        s.model_steps_journaled.to_string(),
    );
    line("tool steps journaled", s.tool_steps_journaled.to_string());
    line(
        "runs answered by the fallback provider",
        s.runs_answered_by_fallback.to_string(),
    );
    line("test server: calls received", s.server.calls.to_string());
    for (status, n) in &s.server.by_status {
        line(&format!("  answered {status}"), n.to_string());
    }
    for (provider, n) in &s.server.by_provider {
        line(&format!("  to {provider}"), n.to_string());
    }
    for b in &s.breakers {
        line(
            &format!("breaker {} (failures)", b.provider),
            format!("{} ({})", b.state, b.failures),
        );
    }
    let k = &s.killed_run;
    format!(
        "{base}\nLLM agent, from the test server's own call counter:\n{out}\
         The killed run had {} model calls answered before the kill; after it the\n\
         server got {} calls for that run, {} model steps ran after the resume,\n\
         and {} calls repeated a model step finished before the kill.\n",
        k.model_steps_before_kill,
        k.server_calls_after_kill,
        k.model_steps_ran_after,
        k.calls_again_for_finished_steps,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(provider: &str, prompt: &str, assistant_turns: usize, attempt: u32) -> Request {
        let mut messages = vec![json!({"role": "user", "content": prompt})];
        messages.extend((0..assistant_turns).map(|_| json!({"role": "assistant", "content": ""})));
        Request {
            provider: provider.to_owned(),
            idempotency_key: Some("r:1".to_owned()),
            body: json!({ "messages": messages }),
            attempt,
        }
    }

    #[test]
    fn the_script_answers_each_scenario() {
        let status = |r: Reply| match r {
            Reply::Status { status, .. } => status,
            Reply::Slow(..) => 1,
            _ => 200,
        };
        assert_eq!(status(reply(&request("primary", &prompt(1), 0, 1))), 503);
        assert_eq!(status(reply(&request("fallback", &prompt(1), 0, 1))), 200);
        assert_eq!(status(reply(&request("primary", &prompt(2), 0, 1))), 429);
        assert_eq!(status(reply(&request("fallback", &prompt(2), 0, 1))), 429);
        assert_eq!(status(reply(&request("primary", &prompt(2), 0, 2))), 200);
        assert_eq!(status(reply(&request("primary", &prompt(3), 0, 1))), 1);
        let Reply::Json(turn2) = reply(&request("primary", &prompt(0), 1, 1)) else {
            panic!("a 200");
        };
        let call = &turn2["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "wait_for_courier");
        assert_eq!(call["arguments"], r#"{"order":"A-0"}"#);
        let Reply::Json(last) = reply(&request("primary", &prompt(0), 3, 1)) else {
            panic!("a 200");
        };
        assert_eq!(
            last["choices"][0]["message"]["content"],
            "Order A-0 has shipped."
        );
    }

    #[tokio::test]
    async fn the_workers_configuration_builds_the_agent_with_its_tools() {
        let server = TestServer::start(reply).await.expect("server");
        let config: Config = config("x.db", &server).parse().expect("parses");
        let table = &config.agents.0[AGENT];
        let agent = crate::agents::build(AGENT, table, "sqlite://x.db").expect("builds");
        let names: Vec<&str> = agent.providers().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["primary", "fallback"]);
        assert!(agent.breakers().is_some());
    }
}
