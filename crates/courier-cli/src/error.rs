//! Command errors and their exit codes: 2 for usage and configuration, 1 for runtime failures.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use courier_core::{TransportError, TransportErrorKind};

/// What went wrong, deciding the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A bad flag, key, value or configuration: exit 2.
    Usage,
    /// Something failed while running: exit 1.
    Runtime,
}

/// A command failed; the message is printed on stderr with passwords redacted.
#[derive(Debug)]
pub(crate) struct CliError {
    pub(crate) kind: Kind,
    message: String,
}

impl CliError {
    /// A usage or configuration error (exit 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Usage,
            message: message.into(),
        }
    }

    /// A runtime failure (exit 1).
    pub(crate) fn runtime(message: impl Into<String>) -> Self {
        Self {
            kind: Kind::Runtime,
            message: message.into(),
        }
    }

    /// The process exit code.
    pub(crate) fn exit_code(&self) -> u8 {
        match self.kind {
            Kind::Usage => 2,
            Kind::Runtime => 1,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&scrub(&self.message))
    }
}

impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> Self {
        Self::runtime(format!("{e:#}"))
    }
}

impl From<TransportError> for CliError {
    fn from(e: TransportError) -> Self {
        let message = chain(&e);
        match e.kind() {
            TransportErrorKind::Config | TransportErrorKind::Unsupported => Self::usage(message),
            _ => Self::runtime(message),
        }
    }
}

impl From<courier_raw::RawError> for CliError {
    fn from(e: courier_raw::RawError) -> Self {
        match e {
            courier_raw::RawError::Unsupported(_) => Self::usage(e.to_string()),
            _ => Self::runtime(e.to_string()),
        }
    }
}

impl From<courier_core::config::ConfigError> for CliError {
    fn from(e: courier_core::config::ConfigError) -> Self {
        Self::usage(chain(&e))
    }
}

/// `error: cause: cause`, each cause once.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Passwords seen in the configuration, never printed.
static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Remembers a secret so [`scrub`] removes it from every message.
pub(crate) fn remember_secret(secret: &str) {
    if secret.len() >= 3 {
        SECRETS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(secret.to_owned());
    }
}

/// Replaces remembered secrets and DSN passwords with `***`.
pub(crate) fn scrub(text: &str) -> String {
    let mut out = text.to_owned();
    for secret in SECRETS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        out = out.replace(secret.as_str(), "***");
    }
    out.split(' ')
        .map(courier_core::redact)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `Result` of a command.
pub(crate) type CliResult<T = ()> = Result<T, CliError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw loop's missing driver is a usage error (exit 2), its failures runtime ones (exit 1).
    #[test]
    fn a_raw_error_keeps_its_exit_code() {
        let unsupported = CliError::from(courier_raw::RawError::Unsupported("no driver".into()));
        assert_eq!(
            (unsupported.exit_code(), unsupported.to_string().as_str()),
            (2, "no driver")
        );
        let failed = CliError::from(courier_raw::RawError::Failed("rows went missing".into()));
        assert_eq!(failed.exit_code(), 1);
    }
}
