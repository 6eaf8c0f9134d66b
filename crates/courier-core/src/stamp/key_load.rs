//! [`KeyLoads`]: how busy each concurrency key of a keyed queue is, with bounded cardinality.

use serde::Serialize;

/// How busy one concurrency key is: its messages delivered and not yet settled (the slots in
/// use), and those waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeyLoad {
    /// The key (`other` for the keys [`KeyLoads::top`] folded together).
    pub key: String,
    /// Delivered and not yet acknowledged, rejected or retried.
    pub in_flight: u64,
    /// Waiting to be delivered.
    pub queued: u64,
}

/// A keyed queue's keys: the busiest ones, and the rest summed in one `other` line, so a
/// display or a metric has a bounded number of labels however many keys there are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KeyLoads {
    /// The most messages of one key in flight at once, when the queue limits it.
    pub max: Option<u32>,
    /// The busiest keys, by in flight then queued (then key), busiest first.
    pub keys: Vec<KeyLoad>,
    /// The other keys' sums (`key` = `other`), when there are more than fit.
    pub other: Option<KeyLoad>,
    /// How many keys `other` sums.
    pub other_keys: usize,
}

impl KeyLoads {
    /// Keeps the `top` busiest of `all` and sums the rest into `other`.
    ///
    /// ```
    /// use courier_core::{KeyLoad, KeyLoads};
    ///
    /// let load = |key: &str, in_flight, queued| KeyLoad { key: key.into(), in_flight, queued };
    /// let loads = KeyLoads::top(Some(3), vec![load("a", 1, 0), load("b", 3, 9), load("c", 0, 2)], 1);
    /// assert_eq!(loads.keys, [load("b", 3, 9)]);
    /// assert_eq!(loads.other, Some(load("other", 1, 2)));
    /// assert_eq!(loads.other_keys, 2);
    /// ```
    #[must_use]
    pub fn top(max: Option<u32>, mut all: Vec<KeyLoad>, top: usize) -> Self {
        all.retain(|k| k.in_flight > 0 || k.queued > 0);
        all.sort_by(|a, b| {
            (b.in_flight, b.queued)
                .cmp(&(a.in_flight, a.queued))
                .then_with(|| a.key.cmp(&b.key))
        });
        let rest = if all.len() > top {
            all.split_off(top)
        } else {
            Vec::new()
        };
        let other = (!rest.is_empty()).then(|| KeyLoad {
            key: "other".to_owned(),
            in_flight: rest.iter().map(|k| k.in_flight).sum(),
            queued: rest.iter().map(|k| k.queued).sum(),
        });
        Self {
            max,
            keys: all,
            other,
            other_keys: rest.len(),
        }
    }
}
