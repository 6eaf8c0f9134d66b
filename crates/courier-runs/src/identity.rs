//! Worker identity: one id per process start, never a configured name.

use std::sync::OnceLock;

/// This process's worker identity, `worker:<host>:<pid>:<random>`, made once per process start.
#[must_use]
pub fn worker_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(new_worker_identity)
}

/// A fresh identity in the same shape (tests: a second "process").
#[must_use]
pub fn new_worker_identity() -> String {
    format!(
        "worker:{}:{}:{:08x}",
        host(),
        std::process::id(),
        fastrand::u32(..)
    )
}

fn host() -> String {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    let host: String = raw
        .trim()
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ':')
        .take(64)
        .collect();
    if host.is_empty() {
        "localhost".to_owned()
    } else {
        host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_per_process_and_shaped() {
        assert_eq!(worker_identity(), worker_identity());
        let parts: Vec<_> = worker_identity().split(':').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0], "worker");
        assert_eq!(parts[2], std::process::id().to_string());
        assert_ne!(new_worker_identity(), new_worker_identity());
    }
}
