//! Environment and naming helpers for service tests.

/// Reads a service URL variable, panicking with setup instructions when it is missing: a service
/// test must fail loudly, never pass by skipping.
///
/// # Panics
/// When the variable is unset or empty.
#[must_use]
pub fn require(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{var} is not set. This test needs a real server: run `scripts/services` \
             (it starts PostgreSQL, MariaDB, Redis, RabbitMQ and NATS on 127.0.0.1, installs Chromium and \
             chromedriver, and prints the variables), \
             export what it prints, then rerun with `--include-ignored`, or run `scripts/test`."
        ),
    }
}

/// `COURIER_TEST_POSTGRES_URL`, e.g. `postgres://postgres@127.0.0.1:5432/test`.
#[must_use]
pub fn postgres_url() -> String {
    require("COURIER_TEST_POSTGRES_URL")
}

/// `COURIER_TEST_MYSQL_URL`, e.g. `mysql://root@127.0.0.1:3306/test`.
#[must_use]
pub fn mysql_url() -> String {
    require("COURIER_TEST_MYSQL_URL")
}

/// `COURIER_TEST_REDIS_URL`, e.g. `redis://127.0.0.1:6379`.
#[must_use]
pub fn redis_url() -> String {
    require("COURIER_TEST_REDIS_URL")
}

/// `COURIER_TEST_AMQP_URL`, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`.
#[must_use]
pub fn amqp_url() -> String {
    require("COURIER_TEST_AMQP_URL")
}

/// `COURIER_TEST_NATS_URL`, e.g. `nats://127.0.0.1:4222` (a server with JetStream enabled).
#[must_use]
pub fn nats_url() -> String {
    require("COURIER_TEST_NATS_URL")
}

/// `COURIER_TEST_CHROMEDRIVER`, the path of Debian's `chromedriver` (package
/// `chromium-driver`, which `scripts/services` installs), e.g. `/usr/bin/chromedriver`.
#[must_use]
pub fn chromedriver() -> String {
    require("COURIER_TEST_CHROMEDRIVER")
}

/// A unique lowercase identifier `prefix_<random>` for a test's table / queue / stream.
#[must_use]
pub fn unique_name(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &id[..12])
}
