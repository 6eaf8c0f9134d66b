//! The deliveries handed out and not yet settled, and which delivery tags of the receiving
//! channel are settled, so that the ack of a batch goes as one `basic.ack(multiple)` when that
//! acks nothing else.

use std::collections::{BTreeSet, HashMap};

use courier_amqp::consume::multiple_ack_to;

/// Deliveries by `(session generation, delivery tag)`; tags count from 1 on each session's
/// receiving channel, every delivery it got (handed out or not) taking the next.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Handed out and not settled: the queue each came from (a retry goes back there).
    queues: HashMap<(u64, u64), String>,
    /// The session whose tags `floor` and `settled` count.
    generation: u64,
    /// Every tag up to here is settled.
    floor: u64,
    /// Settled tags above the floor.
    settled: BTreeSet<u64>,
}

/// How to settle a batch: one multiple ack up to a tag, then each of the rest.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) multiple_to: Option<u64>,
    pub(super) each: Vec<u64>,
}

impl Pending {
    /// Starts counting the tags of `generation` when it is newer (the tags of an older session
    /// cannot be settled any more).
    fn at(&mut self, generation: u64) -> bool {
        if generation > self.generation {
            self.generation = generation;
            self.floor = 0;
            self.settled.clear();
        }
        generation == self.generation
    }

    /// `tag` of `generation`, from `queue`, is handed out.
    pub(super) fn handed_out(&mut self, generation: u64, tag: u64, queue: String) {
        self.at(generation);
        self.queues.insert((generation, tag), queue);
    }

    /// The queue a delivery handed out came from.
    pub(super) fn queue_of(&self, delivery: (u64, u64)) -> Option<&String> {
        self.queues.get(&delivery)
    }

    /// Forgets deliveries of an older session (the broker requeued them when it closed).
    pub(super) fn forget(&mut self, delivery: (u64, u64)) {
        self.queues.remove(&delivery);
    }

    /// How to settle `tags` of `generation` (acks when `ack`): only tags handed out and not
    /// settled, each once; an ack of two or more of them goes as one multiple ack up to the
    /// last tag of the longest run from the floor made of them and tags settled already, so it
    /// never settles a tag not asked for.
    pub(super) fn plan(&self, generation: u64, tags: &[u64], ack: bool) -> Plan {
        let mine: BTreeSet<u64> = tags
            .iter()
            .copied()
            .filter(|&tag| self.queues.contains_key(&(generation, tag)))
            .collect();
        let mut multiple_to = if ack && mine.len() > 1 && generation == self.generation {
            multiple_ack_to(self.floor, &self.settled, &mine)
        } else {
            None
        };
        if let Some(t) = multiple_to
            && mine.range(..=t).count() < 2
        {
            multiple_to = None;
        }
        let each = mine
            .into_iter()
            .filter(|&tag| multiple_to.is_none_or(|t| tag > t))
            .collect();
        Plan { multiple_to, each }
    }

    /// `tag` of `generation` is settled (its frame queued): acked, rejected or given back.
    pub(super) fn settled(&mut self, generation: u64, tag: u64) {
        self.queues.remove(&(generation, tag));
        if !self.at(generation) || tag <= self.floor {
            return;
        }
        self.settled.insert(tag);
        while self.settled.remove(&(self.floor + 1)) {
            self.floor += 1;
        }
    }

    /// Every tag of `generation` up to `tag` is settled (a multiple ack).
    pub(super) fn settled_to(&mut self, generation: u64, tag: u64) {
        self.queues
            .retain(|&(g, t), _| !(g == generation && t <= tag));
        if self.at(generation) && tag > self.floor {
            self.floor = tag;
            self.settled = self.settled.split_off(&(tag + 1));
            while self.settled.remove(&(self.floor + 1)) {
                self.floor += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handed(tags: &[u64]) -> Pending {
        let mut p = Pending::default();
        for &t in tags {
            p.handed_out(1, t, "q".into());
        }
        p
    }

    #[test]
    fn a_batch_from_the_floor_is_one_multiple_ack() {
        let p = handed(&[1, 2, 3, 4]);
        assert_eq!(
            p.plan(1, &[1, 2, 3], true),
            Plan {
                multiple_to: Some(3),
                each: vec![]
            }
        );
    }

    #[test]
    fn a_tag_not_asked_for_stops_the_run() {
        // 2 is still out (another handler's): acking 1, 3 and 4 must not settle it.
        let p = handed(&[1, 2, 3, 4]);
        assert_eq!(
            p.plan(1, &[1, 3, 4], true),
            Plan {
                multiple_to: None,
                each: vec![1, 3, 4]
            }
        );
        // A tag never handed out (a delivery still in the consumer's buffer) stops it too.
        let p = handed(&[1, 3, 4]);
        assert_eq!(p.plan(1, &[3, 4], true).multiple_to, None);
    }

    #[test]
    fn settled_tags_extend_the_run() {
        let mut p = handed(&[1, 2, 3, 4, 5]);
        p.settled(1, 2);
        p.settled(1, 1);
        p.settled(1, 4);
        assert_eq!(p.floor, 2);
        assert_eq!(
            p.plan(1, &[3, 5], true),
            Plan {
                multiple_to: Some(5),
                each: vec![]
            }
        );
        p.settled_to(1, 5);
        assert_eq!((p.floor, p.settled.len(), p.queues.len()), (5, 0, 0));
    }

    #[test]
    fn rejects_stale_and_settled_tags_go_one_by_one_or_not_at_all() {
        let mut p = handed(&[1, 2, 3]);
        assert_eq!(p.plan(1, &[1, 2], false).each, vec![1, 2]);
        p.settled(1, 1);
        // 1 again (settled), 9 (never handed out), an older session's: nothing to send.
        assert_eq!(p.plan(1, &[1, 9], true), Plan::default());
        p.handed_out(2, 1, "q".into());
        assert_eq!(p.plan(1, &[2, 3], true), Plan::default().with_each(&[2, 3]));
        assert_eq!(p.plan(2, &[1], true).each, vec![1]);
    }

    impl Plan {
        fn with_each(mut self, tags: &[u64]) -> Self {
            self.each = tags.to_vec();
            self
        }
    }
}
