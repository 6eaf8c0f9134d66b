//! The error of parsing a stored name (a status, a termination reason, a failure class).

/// A stored name that is not a known status or reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}`")]
pub struct UnknownName {
    /// What was parsed ("status", "termination reason", "failure class").
    pub what: &'static str,
    /// The unknown value.
    pub value: String,
}
