//! What a raw loop's failure is: something this build cannot do (a usage error for the command
//! line), or a failure while running.

use std::fmt;

/// A raw loop failed; `courier-cli` turns it into its own error (exit 2 for
/// [`RawError::Unsupported`], 1 for [`RawError::Failed`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum RawError {
    /// This build lacks what was asked for (the driver of a DSN's scheme).
    Unsupported(String),
    /// A raw loop failed while running (a driver's error, a row gone missing, a timeout).
    Failed(String),
}

impl RawError {
    /// A failure while running.
    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into())
    }

    /// Something this build cannot do.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "the run loop's missing driver")
    )]
    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::Unsupported(message.into())
    }
}

impl fmt::Display for RawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported(message) | Self::Failed(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for RawError {}

/// `Result` of a raw loop.
pub type RawResult<T = ()> = Result<T, RawError>;

/// `error: cause: cause`, each cause once.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code, reason = "used by the run loop")
)]
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
