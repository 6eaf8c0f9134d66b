//! Bad input: a clear message naming the flag, key or DSN, exit 1 or 2, never a panic, never a
//! password.

mod common;

use common::Env;

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let env = Env::empty();
    let err = env
        .run(&["consume", "--fetchsize", "3"])
        .fails(2)
        .to_owned();
    assert!(err.contains("--fetchsize"), "{err}");
    env.run(&["frobnicate"]).fails(2);
    env.run(&[]).fails(2);
}

#[test]
fn an_unknown_transport_name_is_named() {
    let env = Env::with_config();
    let err = env
        .run(&["consume", "nope", "--limit", "1"])
        .fails(2)
        .to_owned();
    assert!(err.contains("nope") && err.contains("async"), "{err}");
    env.run(&["stats", "nope"]).fails(2);
    env.run(&["failed", "show", "--transport", "nope"]).fails(2);
}

#[test]
fn malformed_input_json_is_rejected() {
    let env = Env::with_config();
    let err = env
        .run(&["runs", "submit", "scripted", "--input", r#"{"steps":"#])
        .fails(2)
        .to_owned();
    assert!(err.contains("--input"), "{err}");
    env.run(&["runs", "submit", "scripted", "--input", "@missing.json"])
        .fails(2);
    let err = env
        .run(&["runs", "submit", "nobody", "--input", "{}"])
        .fails(2)
        .to_owned();
    assert!(err.contains("nobody") && err.contains("scripted"), "{err}");
}

#[test]
fn bad_values_name_their_flag() {
    let env = Env::with_config();
    assert!(
        env.run(&["consume", "--time-limit", "soon"])
            .fails(2)
            .contains("soon")
    );
    assert!(
        env.run(&["consume", "--memory-limit", "12X"])
            .fails(2)
            .contains("12X")
    );
    env.run(&["consume", "--concurrency", "0"]).fails(2);
    assert!(
        env.run(&["runs", "list", "--status", "sleeping"])
            .fails(2)
            .contains("--status")
    );
    assert!(
        env.run(&["runs", "show", "not-a-uuid"])
            .fails(2)
            .contains("not-a-uuid")
    );
    env.run(&["runs", "show", "6f1c1c1e-0000-4000-8000-000000000000"])
        .fails(1);
    env.run(&["reap", "--limit", "0"]).fails(2);
}

#[test]
fn a_unique_period_of_zero_is_refused_naming_the_flag() {
    let env = Env::with_config();
    let submit = |extra: &[&str]| {
        let mut args = vec!["runs", "submit", "scripted"];
        args.extend_from_slice(extra);
        env.run(&args).fails(2).to_owned()
    };
    let err = submit(&["--unique", "k", "--unique-for", "0s"]);
    assert!(err.contains("--unique-for") && err.contains("`k`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let err = submit(&["--unique", "k"]);
    assert!(
        err.contains("--unique-for"),
        "a key needs its period: {err}"
    );
    let err = submit(&["--unique-for", "1h"]);
    assert!(err.contains("--unique"), "a period needs its key: {err}");
    let long = "k".repeat(191);
    let err = submit(&["--unique", &long, "--unique-for", "1h"]);
    assert!(err.contains("--unique") && err.contains("190"), "{err}");
    let err = submit(&["--unique", "k", "--unique-for", "1h", "--interactive"]);
    assert!(err.contains("--interactive"), "{err}");
    let list = env.run(&["runs", "list", "--format", "json"]).json();
    assert_eq!(
        list.as_array().map(Vec::len),
        Some(0),
        "nothing queued: {list}"
    );
}

#[test]
fn an_unreadable_config_is_named() {
    let env = Env::empty();
    let err = env
        .run(&["--config", "missing.toml", "stats"])
        .fails(2)
        .to_owned();
    assert!(err.contains("missing.toml"), "{err}");
    std::fs::create_dir(env.path("dir.toml")).expect("dir");
    env.run(&["--config", "dir.toml", "stats"]).fails(2);
    let via_env = env
        .command(&["stats"])
        .env("COURIER_CONFIG", "absent.toml")
        .output()
        .expect("run");
    assert_eq!(via_env.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&via_env.stderr).contains("absent.toml"));
}

#[test]
fn a_config_with_an_unknown_key_is_named() {
    let env = Env::empty();
    env.write("bad.toml", "[transports.async]\ndns = \"sqlite://x.db\"\n");
    assert!(
        env.run(&["--config", "bad.toml", "stats"])
            .fails(2)
            .contains("dns")
    );
    env.write(
        "runs.toml",
        "[transports.async]\ndsn = \"sqlite://x.db\"\n[runs]\nleese = \"1s\"\n",
    );
    assert!(
        env.run(&["--config", "runs.toml", "runs", "list"])
            .fails(2)
            .contains("leese")
    );
    env.write(
        "var.toml",
        "[transports.async]\ndsn = \"${COURIER_TEST_UNSET_VAR}\"\n",
    );
    assert!(
        env.run(&["--config", "var.toml", "stats"])
            .fails(2)
            .contains("COURIER_TEST_UNSET_VAR")
    );
    env.write("empty.toml", "");
    assert!(
        env.run(&["--config", "empty.toml", "consume", "--limit", "1"])
            .fails(2)
            .contains("transport")
    );
}

#[test]
fn a_server_that_is_down_gives_a_clear_error_without_the_password() {
    let env = Env::empty();
    for dsn in [
        "postgres://app:hunter2secret@127.0.0.1:1/app?acquire_timeout=2s",
        "redis://:hunter2secret@127.0.0.1:1",
    ] {
        env.write(
            "down.toml",
            &format!("[transports.async]\ndsn = \"{dsn}\"\n"),
        );
        let out = env.run(&["--config", "down.toml", "stats"]);
        assert!(out.code == 1 || out.code == 2, "{out:?}");
        out.fails(out.code);
        assert!(
            !out.stderr.contains("hunter2secret") && !out.stdout.contains("hunter2secret"),
            "{out:?}"
        );
        assert!(
            out.stderr.contains("async"),
            "names the transport: {}",
            out.stderr
        );
        let bench = env.run(&["bench", "--dsn", dsn, "--messages", "10"]);
        assert!(bench.code == 1 || bench.code == 2, "{bench:?}");
        assert!(!bench.stderr.contains("hunter2secret"), "{bench:?}");
    }
    let bad = env.run(&["bench", "--dsn", "not a dsn"]);
    bad.fails(2);
}

/// A token written in the user's place (`redis://TOKEN@host`, `nats://TOKEN@host`) is
/// hidden like a password: in the error about the server and in `bench`'s.
#[test]
fn a_token_in_the_users_place_is_never_printed() {
    let env = Env::empty();
    let mut dsns = vec!["redis://hunter2token@127.0.0.1:1"];
    if cfg!(feature = "nats") {
        dsns.push("nats://hunter2token@127.0.0.1:1");
    }
    for dsn in dsns {
        env.write(
            "down.toml",
            &format!("[transports.async]\ndsn = \"{dsn}\"\n"),
        );
        for args in [
            &["--config", "down.toml", "stats"][..],
            &["--config", "down.toml", "-v", "setup"][..],
            &["bench", "--dsn", dsn, "--messages", "10"][..],
        ] {
            let out = env.run(args);
            assert!(out.code == 1 || out.code == 2, "{args:?}: {out:?}");
            out.fails(out.code);
            assert!(
                !out.stderr.contains("hunter2token") && !out.stdout.contains("hunter2token"),
                "{args:?}: {out:?}"
            );
        }
    }
}

#[test]
fn a_reap_interval_longer_than_the_lease_names_the_flag() {
    let env = Env::with_config();
    let err = env
        .run(&["consume", "--reap-every", "1h", "--limit", "1"])
        .fails(2)
        .to_owned();
    assert!(
        err.contains("--reap-every") && err.contains("runs.lease"),
        "{err}"
    );
    env.run(&["consume", "--reap-every", "0s", "--limit", "1"])
        .fails(2);
}

#[test]
fn a_lease_under_one_second_is_a_config_error() {
    let env = Env::empty();
    env.write(
        "short.toml",
        "[transports.async]\ndsn = \"sqlite://courier.db\"\n[runs]\nlease = \"1ms\"\n",
    );
    let err = env
        .run(&["--config", "short.toml", "runs", "list"])
        .fails(2)
        .to_owned();
    assert!(err.contains("runs.lease") && err.contains("1s"), "{err}");
}

#[cfg(feature = "postgres")]
#[test]
fn a_run_store_dsn_that_does_not_parse_is_a_config_error() {
    let env = Env::empty();
    env.write(
        "store.toml",
        "[transports.async]\ndsn = \"sqlite://courier.db\"\n\
         [runs]\nstore = \"postgres://app:ab/cd+ef==@127.0.0.1:1/app\"\n",
    );
    for args in [&["runs", "list"][..], &["consume", "--limit", "1"][..]] {
        let mut all = vec!["--config", "store.toml"];
        all.extend_from_slice(args);
        let err = env.run(&all).fails(2).to_owned();
        assert!(err.contains("runs.store"), "{args:?}: {err}");
    }
}

#[test]
fn a_dashboard_off_loopback_needs_a_token() {
    let env = Env::with_config();
    let err = env
        .run(&["dashboard", "--listen", "0.0.0.0:0"])
        .fails(2)
        .to_owned();
    assert!(
        err.contains("--listen 0.0.0.0:0")
            && err.contains("--token")
            && err.contains("COURIER_DASHBOARD_TOKEN"),
        "{err}"
    );
    let err = env
        .run(&["dashboard", "--listen", "nowhere"])
        .fails(2)
        .to_owned();
    assert!(err.contains("--listen"), "{err}");
}

#[test]
fn a_bad_schedule_is_a_config_error_naming_the_key() {
    let env = Env::empty();
    let base = "[transports.async]\ndsn = \"in-memory://\"\n[routing]\n\"app.tick\" = \"async\"\n";
    for (schedule, named) in [
        (
            "message = \"app.tick\"\ncron = \"61 * * * *\"\n",
            "schedules.s.cron",
        ),
        (
            "message = \"app.tick\"\ncron = \"* * * * *\"\ntimezone = \"Mars/Olympus\"\n",
            "schedules.s.timezone",
        ),
        (
            "message = \"app.tick\"\nevery = \"0s\"\n",
            "schedules.s.every",
        ),
        ("message = \"app.tick\"\n", "schedules.s"),
        (
            "message = \"app.tick\"\nevery = \"1s\"\nmissed = \"later\"\n",
            "schedules.s.missed",
        ),
        (
            "message = \"app.nowhere\"\nevery = \"1s\"\n",
            "schedules.s.message",
        ),
    ] {
        env.write("c.toml", &format!("{base}[schedules.s]\n{schedule}"));
        let err = env
            .run(&["--config", "c.toml", "schedules"])
            .fails(2)
            .to_owned();
        assert!(err.contains(named), "{schedule}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Every command checks them, before it connects or starts a worker.
    for (schedule, named) in [
        ("cron = \"0 0 25 * * * *\"\n", "schedules.s.cron"),
        (
            "cron = \"0 6 * * *\"\ntimezone = \"Europe/Atlantis\"\n",
            "schedules.s.timezone",
        ),
    ] {
        env.write(
            "c.toml",
            &format!("{base}[schedules.s]\nmessage = \"app.tick\"\n{schedule}"),
        );
        for command in [&["setup"][..], &["consume", "async", "--time-limit", "5s"]] {
            let mut args = vec!["--config", "c.toml"];
            args.extend_from_slice(command);
            let err = env.run(&args).fails(2).to_owned();
            assert!(err.contains(named), "{command:?} {schedule}: {err}");
        }
    }
    // A store is needed: in-memory transports keep none.
    env.write(
        "c.toml",
        &format!("{base}[schedules.s]\nmessage = \"app.tick\"\nevery = \"1s\"\n"),
    );
    let err = env
        .run(&["--config", "c.toml", "schedules"])
        .fails(2)
        .to_owned();
    assert!(err.contains("schedule store"), "{err}");
}

#[test]
fn a_bad_rate_limit_is_a_config_error_naming_the_key() {
    let env = Env::empty();
    for (limit, named) in [
        ("{ limit = 0 }", "transports.async.rate_limit.limit"),
        ("{ limit = -5 }", "transports.async.rate_limit.limit"),
        (
            "{ limit = 50, interval = \"0s\" }",
            "transports.async.rate_limit.interval",
        ),
        (
            "{ limit = 50, interval = \"-1s\" }",
            "transports.async.rate_limit.interval",
        ),
        (
            "{ limit = 50, interval = \"often\" }",
            "transports.async.rate_limit.interval",
        ),
        (
            "{ limit = 50, burst = 0 }",
            "transports.async.rate_limit.burst",
        ),
    ] {
        env.write(
            "c.toml",
            &format!("[transports.async]\ndsn = \"in-memory://\"\nrate_limit = {limit}\n"),
        );
        let err = env
            .run(&["--config", "c.toml", "consume", "async", "--limit", "1"])
            .fails(2)
            .to_owned();
        assert!(err.contains(named), "{limit}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
