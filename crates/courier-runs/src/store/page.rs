//! Paging through runs: [`RunPageQuery`] for [`RunStore::page`](super::RunStore::page), keyset
//! pagination over the newest-first order `(created_at DESC, id DESC)`.
//!
//! A page starts after a [`RunCursor`] (the position of a run in that order), never at an
//! offset, so a page deep in the list costs what the first one does: the SQL stores seek in
//! the `(created_at, id)`, `(status, created_at, id)` and `(agent, created_at, id)` indexes
//! (migration 0005) and read `limit` rows.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use super::Run;
use crate::RunStatus;

/// The position of a run in the newest-first order: its creation time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunCursor {
    /// Creation time, epoch ms.
    pub created_at: i64,
    /// The run id (ties between equal times are ordered by id).
    pub id: Uuid,
}

impl RunCursor {
    /// The position of `run`.
    #[must_use]
    pub fn of(run: &Run) -> Self {
        Self {
            created_at: run.created_at,
            id: run.id,
        }
    }
}

/// `<created_at>_<id>`, the form it takes in a URL.
impl fmt::Display for RunCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.created_at, self.id)
    }
}

/// A cursor that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid run cursor (expected `<created_at>_<uuid>`)")]
pub struct InvalidCursor;

impl FromStr for RunCursor {
    type Err = InvalidCursor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (at, id) = s.split_once('_').ok_or(InvalidCursor)?;
        Ok(Self {
            created_at: at.parse().map_err(|_| InvalidCursor)?,
            id: id.parse().map_err(|_| InvalidCursor)?,
        })
    }
}

/// Where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageFrom {
    /// The newest runs.
    #[default]
    Newest,
    /// The runs older than the cursor (the next page).
    Before(RunCursor),
    /// The runs newer than the cursor (the previous page), the closest ones.
    After(RunCursor),
}

/// Which runs [`RunStore::page`](super::RunStore::page) returns: those matching every filter
/// set, from `from`, at most `limit`, always newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPageQuery {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this agent.
    pub agent: Option<String>,
    /// Where the page starts.
    pub from: PageFrom,
    /// At most this many runs.
    pub limit: usize,
}

impl Default for RunPageQuery {
    fn default() -> Self {
        Self {
            status: None,
            agent: None,
            from: PageFrom::Newest,
            limit: 50,
        }
    }
}

impl RunPageQuery {
    /// The newest `limit` runs.
    #[must_use]
    pub fn newest(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Only runs with `status`.
    #[must_use]
    pub fn status(mut self, status: RunStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only runs of `agent`.
    #[must_use]
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Starting at `from`.
    #[must_use]
    pub fn from(mut self, from: PageFrom) -> Self {
        self.from = from;
        self
    }

    /// Whether `run` passes the filters and lies on the page's side of its cursor (what the
    /// SQL `WHERE` says; for stores that filter in memory).
    #[must_use]
    pub fn matches(&self, run: &Run) -> bool {
        let at = RunCursor::of(run);
        self.status.is_none_or(|s| run.status == s)
            && self.agent.as_deref().is_none_or(|a| run.agent == a)
            && match self.from {
                PageFrom::Newest => true,
                PageFrom::Before(c) => at < c,
                PageFrom::After(c) => at > c,
            }
    }

    /// The page of `runs` (any order) this query selects, newest first: filtered, sorted and
    /// cut in memory.
    #[must_use]
    pub fn select(&self, runs: impl IntoIterator<Item = Run>) -> Vec<Run> {
        let mut page: Vec<Run> = runs.into_iter().filter(|r| self.matches(r)).collect();
        page.sort_by_key(|r| std::cmp::Reverse(RunCursor::of(r)));
        if let PageFrom::After(_) = self.from {
            // The closest newer runs: the tail of the newest-first order.
            let skip = page.len().saturating_sub(self.limit);
            page.drain(..skip);
        } else {
            page.truncate(self.limit);
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_through_its_text() {
        let c = RunCursor {
            created_at: 1_700_000_000_123,
            id: Uuid::new_v4(),
        };
        assert_eq!(c.to_string().parse::<RunCursor>(), Ok(c));
        assert_eq!("12".parse::<RunCursor>(), Err(InvalidCursor));
        assert_eq!("x_y".parse::<RunCursor>(), Err(InvalidCursor));
    }
}
