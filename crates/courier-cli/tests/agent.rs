//! `[agents.NAME]` (feature `agent`): `courier runs submit` and `courier consume` run an LLM
//! agent configured in TOML against an OpenAI-compatible server on 127.0.0.1 (a plain HTTP/1
//! server in this test, counting calls); its key comes from `${ENV}`, is sent, and appears in
//! no output of the commands, even when the provider refuses it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Env, Run, wait};

const KEY: &str = "sk-cli-canary-55aa77cc";

/// Serves each connection the next scripted (status, body); records the Authorization headers.
fn server(script: Vec<(u16, String)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        let mut script = script.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let (mut length, mut auth) = (0usize, String::new());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                if lower.starts_with("authorization:") {
                    auth = line["authorization:".len()..].trim().to_owned();
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            record.lock().expect("lock").push(auth);
            let (status, body) = script.next().unwrap_or((500, "{}".to_owned()));
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (format!("http://{addr}/v1"), seen)
}

fn config(base_url: &str) -> String {
    format!(
        "{}\n[agents.helper]\nsystem = \"Be brief.\"\nmax_turns = 3\n\
         [[agents.helper.providers]]\nname = \"local\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n\
         api_key = \"${{COURIER_TEST_AGENT_KEY}}\"\ntimeout = \"5s\"\n",
        common::CONFIG
    )
}

fn run(env: &Env, args: &[&str]) -> Run {
    let child = env
        .command(args)
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait(child, Duration::from_secs(60))
}

fn assert_no_key(run: &Run) {
    assert!(
        !run.stdout.contains(KEY) && !run.stderr.contains(KEY),
        "a key in the output: {run:?}"
    );
}

fn submit_and_consume(env: &Env) -> serde_json::Value {
    let submitted = run(
        env,
        &[
            "runs",
            "submit",
            "helper",
            "--input",
            r#"{"prompt":"hi"}"#,
            "--format",
            "json",
        ],
    );
    assert_no_key(&submitted);
    let id = submitted.json()["id"].as_str().expect("id").to_owned();
    let consumed = run(
        env,
        &["consume", "--limit", "1", "--time-limit", "30s", "-vv"],
    );
    assert_no_key(&consumed);
    consumed.ok();
    let shown = run(env, &["runs", "show", &id, "--format", "json"]);
    assert_no_key(&shown);
    shown.json()
}

#[test]
fn a_configured_llm_agent_runs_from_submit_to_consume() {
    let answer = r#"{"choices":[{"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#;
    let (url, seen) = server(vec![(200, answer.to_owned())]);
    let env = Env::empty();
    env.write("courier.toml", &config(&url));
    let run = submit_and_consume(&env);
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["output"]["answer"], "hello there");
    assert_eq!(
        seen.lock().expect("lock").as_slice(),
        [format!("Bearer {KEY}")],
        "one call, with the key"
    );
}

#[test]
fn a_refused_key_fails_the_run_as_auth_and_is_never_printed() {
    let (url, seen) = server(vec![(401, r#"{"error":{"message":"bad key"}}"#.to_owned())]);
    let env = Env::empty();
    env.write("courier.toml", &config(&url));
    let run = submit_and_consume(&env);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error_class"], "auth");
    assert_eq!(seen.lock().expect("lock").len(), 1, "not retried");
}

/// The agent of `config`, its one provider behind a breaker of `policy` (the run store's
/// database keeps it).
fn breaker_config(base_url: &str, policy: &str) -> String {
    config(base_url).replace(
        "max_turns = 3\n",
        &format!("max_turns = 3\nbreaker = {{ {policy} }}\n"),
    )
}

/// The value of `name{provider="local"}` in a Prometheus scrape of 127.0.0.1:`port`.
#[cfg(unix)]
fn scrape(port: u16, name: &str) -> Option<f64> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let series = format!("{name}{{provider=\"local\"}} ");
    response
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

/// A provider answering 503: its breaker opens after 2 failures (the server sees 2 calls, no
/// third); `courier stats` shows it open with its failures and when it opened, `stats --breakers
/// --format json` gives it as data, and `consume --metrics` exports its state as the gauge
/// `courier_agent_breaker_state{provider="local"}` (2: open).
#[cfg(unix)]
#[test]
fn an_open_breaker_shows_in_stats_and_in_the_metrics() {
    let (url, seen) = server(vec![(503, "{}".to_owned()); 8]);
    let env = Env::empty();
    env.write(
        "courier.toml",
        &breaker_config(&url, r#"failures = 2, window = "60s", cooldown = "10m""#),
    );
    let submitted = run(
        &env,
        &["runs", "submit", "helper", "--input", r#"{"prompt":"hi"}"#],
    );
    submitted.ok();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = env
        .command(&["consume", "--metrics", &addr, "--sleep", "20ms", "--quiet"])
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    common::eventually("the breaker gauge to say open", || {
        scrape(port, "courier_agent_breaker_state") == Some(2.0)
    });
    assert_eq!(
        scrape(port, "courier_agent_breaker_failures"),
        Some(2.0),
        "two failures in the window"
    );
    common::signal(&child, "TERM");
    let consumed = wait(child, Duration::from_secs(30));
    assert_no_key(&consumed);
    assert_eq!(
        seen.lock().expect("lock").len(),
        2,
        "the open breaker kept every later attempt off the server"
    );

    let stats = run(&env, &["stats"]);
    assert_no_key(&stats);
    let text = stats.ok();
    assert!(text.contains("BREAKER"), "{text}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("local"))
        .unwrap_or_else(|| panic!("no breaker line for `local` in {text}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..3], ["local", "open", "2"], "{text}");
    assert!(cells[3].starts_with("20"), "opened at a date: {text}");
    assert!(
        text.contains("async"),
        "the transports are still counted: {text}"
    );

    let json = run(&env, &["stats", "--breakers", "--format", "json"]).json();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["provider"], "local", "{json}");
    assert_eq!(json[0]["state"], "open", "{json}");
    assert_eq!(json[0]["failures"], 2, "{json}");
    assert!(json[0]["opened_at"].is_string(), "{json}");

    // The dashboard's workers page shows it too (and no key).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let dashboard = env
        .command(&["dashboard", "--listen", &addr])
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut page = String::new();
    common::eventually("the dashboard's workers page", || {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let sent = write!(
            stream,
            "GET /workers HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        page.clear();
        sent.is_ok() && stream.read_to_string(&mut page).is_ok() && page.contains("</html>")
    });
    common::signal(&dashboard, "TERM");
    let served = wait(dashboard, Duration::from_secs(30));
    assert_no_key(&served);
    assert!(!page.contains(KEY), "a key on the page");
    let table = &page[page.find("id=\"breakers\"").expect("a breakers table")..];
    let row = &table[table.find("local").expect("local")..];
    let row = &row[..row.find("</tr>").expect("row end")];
    assert!(row.contains(">open<") && row.contains(">2<"), "{row}");
}

/// Without a `breaker` in any agent table, `stats` shows no breaker and `--breakers` says why.
#[test]
fn stats_without_breakers_shows_none() {
    let (url, _seen) = server(Vec::new());
    let env = Env::empty();
    env.write("courier.toml", &config(&url));
    let text = run(&env, &["stats"]).ok().to_owned();
    assert!(!text.contains("BREAKER"), "{text}");
    let refused = run(&env, &["stats", "--breakers"]);
    assert!(refused.fails(2).contains("breaker"), "{}", refused.stderr);
}

/// A worker process of `env` consuming until `done` holds for the runs it shows; then stopped.
#[cfg(unix)]
fn consume_until(env: &Env, what: &str, done: impl Fn() -> bool) -> Run {
    let child = env
        .command(&["consume", "--sleep", "20ms", "--quiet"])
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    common::eventually(what, &done);
    common::signal(&child, "TERM");
    let run = wait(child, Duration::from_secs(30));
    assert_no_key(&run);
    run
}

fn submit(env: &Env) -> String {
    let submitted = run(
        env,
        &[
            "runs",
            "submit",
            "helper",
            "--input",
            r#"{"prompt":"hi"}"#,
            "--format",
            "json",
        ],
    );
    submitted.json()["id"].as_str().expect("id").to_owned()
}

fn breakers(env: &Env) -> serde_json::Value {
    run(env, &["stats", "--breakers", "--format", "json"]).json()
}

/// One breaker shared by worker processes through the SQLite run store: process A's two 503s
/// open it; process B, which never saw a failure, then skips the provider (the server's counter
/// does not move, B's run fails `circuit_open`); after the cooldown, with two processes
/// consuming, one call probes (half-open), the server answers, the breaker closes and both runs
/// complete.
#[cfg(unix)]
#[test]
fn a_breaker_opened_by_one_worker_process_is_open_for_another() {
    let answer = r#"{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    let mut script = vec![(503, "{}".to_owned()); 2];
    script.extend(vec![(200, answer.to_owned()); 4]);
    let (url, seen) = server(script);
    let calls = || seen.lock().expect("lock").len();
    let env = Env::empty();
    let cooldown = Duration::from_secs(6);
    env.write(
        "courier.toml",
        &breaker_config(&url, r#"failures = 2, window = "60s", cooldown = "6s""#),
    );
    let show = |id: &str| run(&env, &["runs", "show", id, "--format", "json"]).json();
    let status = |id: &str| show(id)["status"].as_str().unwrap_or("").to_owned();

    // Process A: two 503s open the breaker; its later attempts are refused without a call.
    let first = submit(&env);
    consume_until(&env, "run 1 to fail", || status(&first) == "failed");
    assert_eq!(calls(), 2, "two calls, then the open breaker");
    let b = breakers(&env);
    assert_eq!(
        (b[0]["state"].as_str(), b[0]["failures"].as_u64()),
        (Some("open"), Some(2)),
        "{b}"
    );
    let opened_at = b[0]["opened_at"].clone();

    // Process B: a fresh process, no failure of its own: the provider is skipped.
    let second = submit(&env);
    consume_until(&env, "run 2 to fail", || status(&second) == "failed");
    assert_eq!(calls(), 2, "process B never called the provider");
    let shown = show(&second);
    assert_eq!(shown["error_class"], "circuit_open", "{shown}");
    assert_eq!(breakers(&env)[0]["opened_at"], opened_at, "not reopened");

    // After the cooldown, two processes: one probe, answered, closes it for both.
    std::thread::sleep(cooldown);
    // Room for the run refused while the other probes to be requeued until the breaker closes.
    env.write(
        "courier.toml",
        &breaker_config(&url, r#"failures = 2, window = "60s", cooldown = "6s""#)
            .replace("[runs]\n", "[runs]\nmax_requeues = 50\n"),
    );
    let (third, fourth) = (submit(&env), submit(&env));
    let other = env
        .command(&["consume", "--sleep", "20ms", "--quiet"])
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    consume_until(&env, "runs 3 and 4 to complete", || {
        status(&third) == "completed" && status(&fourth) == "completed"
    });
    common::signal(&other, "TERM");
    assert_no_key(&wait(other, Duration::from_secs(30)));
    assert_eq!(calls(), 4, "one probe, then one call for the other run");
    let b = breakers(&env);
    assert_eq!(
        (b[0]["state"].as_str(), b[0]["failures"].as_u64()),
        (Some("closed"), Some(0)),
        "{b}"
    );
}

/// `GET path` on the dashboard at 127.0.0.1:`port` (`Connection: close`): the raw response.
#[cfg(unix)]
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// A provider with `stream = true`: the run completes with the folded answer, its chunks are in
/// the run store's database, and `courier dashboard` serves them at `GET /runs/ID/stream` as SSE
/// (ids 1, 2, ..., `done` last), resuming after `?after=`.
#[cfg(unix)]
#[test]
fn a_streaming_agents_tokens_are_served_by_the_dashboard() {
    let chunk = |text: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    };
    let body = format!(
        "{}{}data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":2}}}}\n\ndata: [DONE]\n\n",
        chunk("Hel"),
        chunk("lo")
    );
    let (url, seen) = server(vec![(200, body)]);
    let env = Env::empty();
    env.write(
        "courier.toml",
        &config(&url).replace("timeout = \"5s\"\n", "timeout = \"5s\"\nstream = true\n"),
    );
    let shown = submit_and_consume(&env);
    assert_eq!(shown["status"], "completed", "{shown}");
    assert_eq!(shown["output"]["answer"], "Hello", "folded");
    assert_eq!(seen.lock().expect("lock").len(), 1);
    let id = shown["id"].as_str().expect("id").to_owned();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dashboard = env
        .command(&["dashboard", "--listen", &format!("127.0.0.1:{port}")])
        .env("COURIER_TEST_AGENT_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut response = String::new();
    common::eventually("the dashboard to serve the stream", || {
        response = http_get(port, &format!("/runs/{id}/stream")).unwrap_or_default();
        response.contains("event: done")
    });
    let resumed = http_get(port, &format!("/runs/{id}/stream?after=1")).unwrap_or_default();
    common::signal(&dashboard, "TERM");
    assert_no_key(&wait(dashboard, Duration::from_secs(30)));
    assert!(response.contains("text/event-stream"), "{response}");
    let events: Vec<(i64, String, String)> = {
        let mut out = Vec::new();
        let (mut id, mut kind) = (0, String::new());
        for line in response.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().expect("an offset");
            } else if let Some(v) = line.strip_prefix("event: ") {
                kind = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                out.push((id, kind.clone(), v.to_owned()));
            }
        }
        out
    };
    let ids: Vec<i64> = events.iter().map(|e| e.0).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as i64).collect::<Vec<_>>(),
        "{response}"
    );
    let text: String = events
        .iter()
        .filter(|e| e.1 == "chunk")
        .map(|e| e.2.as_str())
        .collect();
    assert_eq!(text, "Hello", "{response}");
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("done"));
    assert!(
        !resumed.contains("id: 1\n") && resumed.contains("id: 2\n"),
        "{resumed}"
    );
}
