//! Unique runs: a key a run holds for a period from its enqueue, so that enqueuing another run
//! with the same key inside the period enqueues nothing (Oban's and River's unique jobs).

use std::time::Duration;

use uuid::Uuid;

use super::Run;

/// A run's uniqueness key and how long the run holds it from its enqueue
/// ([`Runtime::enqueue_unique`](crate::Runtime::enqueue_unique)). While a run holds the key,
/// enqueuing another with the same key is a [duplicate](Inserted::Duplicate); once the period
/// has passed the key is free again, whatever the holder's status. A run whose dispatch failed
/// gives its key back at once.
///
/// ```
/// use courier_runs::UniqueKey;
/// use std::time::Duration;
///
/// let unique = UniqueKey::new("report:2024-06-01", Duration::from_secs(3600))?;
/// assert_eq!(unique.key(), "report:2024-06-01");
/// assert!(UniqueKey::new("report", Duration::ZERO).is_err());
/// # Ok::<(), courier_runs::InvalidUnique>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKey {
    key: String,
    period: Duration,
}

impl UniqueKey {
    /// The longest key, in bytes (the SQL stores' column holds 190 characters).
    pub const MAX_BYTES: usize = 190;

    /// `key`, held for `period`.
    ///
    /// # Errors
    /// An empty key, a key longer than [`UniqueKey::MAX_BYTES`], or a period of zero.
    pub fn new(key: impl Into<String>, period: Duration) -> Result<Self, InvalidUnique> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidUnique::EmptyKey);
        }
        if key.len() > Self::MAX_BYTES {
            return Err(InvalidUnique::KeyTooLong { bytes: key.len() });
        }
        if period.is_zero() {
            return Err(InvalidUnique::ZeroPeriod { key });
        }
        Ok(Self { key, period })
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How long a run holds it.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.period
    }
}

/// A [`UniqueKey`] that cannot be held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidUnique {
    /// The key is empty.
    #[error("the unique key is empty")]
    EmptyKey,
    /// The key is longer than [`UniqueKey::MAX_BYTES`].
    #[error("the unique key is {bytes} bytes long, more than the maximum of {max}", max = UniqueKey::MAX_BYTES)]
    KeyTooLong {
        /// Its length.
        bytes: usize,
    },
    /// The period is zero: the key would be free again at once.
    #[error("the unique period of key `{key}` must be longer than zero")]
    ZeroPeriod {
        /// The key.
        key: String,
    },
}

/// What [`RunStore::insert_queued_unique`](super::RunStore::insert_queued_unique) did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Inserted {
    /// The run was inserted `queued`, holding the key: the row as stored.
    Queued(Box<Run>),
    /// Another run holds the key inside its period: nothing was inserted. Its id.
    Duplicate(Uuid),
}

/// What [`Runtime::enqueue_unique`](crate::Runtime::enqueue_unique) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// A new run was queued and dispatched: its id.
    Queued(Uuid),
    /// A run holding the same key inside its period exists: nothing was enqueued. Its id.
    Duplicate(Uuid),
}

impl Enqueued {
    /// The id of the run: the new one, or the one holding the key.
    #[must_use]
    pub fn id(self) -> Uuid {
        match self {
            Self::Queued(id) | Self::Duplicate(id) => id,
        }
    }

    /// Whether nothing was enqueued because another run holds the key.
    #[must_use]
    pub fn is_duplicate(self) -> bool {
        matches!(self, Self::Duplicate(_))
    }
}
