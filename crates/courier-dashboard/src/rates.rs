//! Queue rates from depth samples: the depth of each transport is sampled every few seconds
//! (and on every overview), and the rate shown is the net change of the depth per second over
//! the last [`WINDOW`]: positive while a queue grows, negative while it drains, `None` until two
//! samples at least [`MIN_SPAN`] apart exist. It is what the depth says, not a count of sends
//! or acks (a queue that receives and consumes 100 messages a second at an even pace shows 0).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use courier_core::config::Transports;
use tokio::time::Instant;

/// The span the rate is computed over.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// The shortest span a rate is computed from.
pub(crate) const MIN_SPAN: Duration = Duration::from_secs(2);

/// Depth samples per transport.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    samples: Mutex<BTreeMap<String, VecDeque<(Instant, u64)>>>,
}

impl Rates {
    /// Records a depth.
    pub(crate) fn record(&self, transport: &str, depth: u64) {
        self.record_at(transport, depth, Instant::now());
    }

    fn record_at(&self, transport: &str, depth: u64, at: Instant) {
        let mut samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = samples.entry(transport.to_owned()).or_default();
        list.push_back((at, depth));
        while list
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > WINDOW)
        {
            list.pop_front();
        }
    }

    /// Samples every transport that can count (errors are skipped: the overview shows them).
    pub(crate) async fn sample(&self, transports: &Transports) {
        for (name, t) in transports.all() {
            if let Some(count) = t.as_message_count()
                && let Ok(depth) = count.message_count().await
            {
                self.record(name, depth);
            }
        }
    }

    /// The net change of `transport`'s depth per second over the window.
    pub(crate) fn per_second(&self, transport: &str) -> Option<f64> {
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let list = samples.get(transport)?;
        let (first, last) = (list.front()?, list.back()?);
        let span = last.0.duration_since(first.0);
        if span < MIN_SPAN {
            return None;
        }
        #[allow(clippy::cast_precision_loss, reason = "queue depths fit an f64")]
        let change = last.1 as f64 - first.1 as f64;
        Some(change / span.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_the_net_change_per_second_over_the_window() {
        let rates = Rates::default();
        let t0 = Instant::now();
        rates.record_at("async", 100, t0);
        assert_eq!(rates.per_second("async"), None, "one sample");
        rates.record_at("async", 90, t0 + Duration::from_secs(1));
        assert_eq!(rates.per_second("async"), None, "too short a span");
        rates.record_at("async", 80, t0 + Duration::from_secs(10));
        assert_eq!(rates.per_second("async"), Some(-2.0));
        // Samples older than the window are dropped.
        rates.record_at("async", 200, t0 + Duration::from_secs(70));
        assert_eq!(rates.per_second("async"), Some(2.0));
        assert_eq!(rates.per_second("other"), None);
    }
}
