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
