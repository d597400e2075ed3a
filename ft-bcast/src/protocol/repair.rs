//! Failures and revocation. When a rank dies, every tree of every broadcast re-attaches
//! around it: a rank whose parent died re-requests what it lacks from its nearest live
//! ancestor (the root at worst, which holds everything), each output from the end of
//! the prefix it holds (`Broadcaster::send_request`), and a rank whose descendant
//! died adopts that descendant's children. A revoked communicator fails every broadcast
//! still in flight here.

use alloc::vec::Vec;

use ft_core::{Instant, Rank};

use super::state::Outgoing;
use super::{BcastError, BcastEvent, Broadcaster, TaskId};
use crate::outputs::OutputSet;

impl Broadcaster {
    /// The communicator was revoked: every task still in flight here (this rank lacks
    /// some of what it fetches, or still owes data to a child) fails with
    /// [`BcastEvent::Failed`]; later `start_broadcast` calls are refused and broadcast
    /// frames are dropped with [`FrameError::Revoked`](ft_core::FrameError::Revoked). Finished tasks keep their data.
    pub fn revoke(&mut self, _now: Instant) {
        if self.revoked {
            return;
        }
        self.revoked = true;
        self.root_template = None;
        let streaming: Vec<TaskId> = self
            .out
            .iter()
            .filter_map(|o| match o {
                Outgoing::Stream { task, .. } => Some(*task),
                Outgoing::Frame { .. } | Outgoing::Withdrawn { .. } => None,
            })
            .collect();
        let in_flight: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(id, t)| {
                !t.abandoned
                    && (streaming.contains(id)
                        || !t.parked.is_empty()
                        || !t.waiting.is_empty()
                        || t.trees
                            .values()
                            .any(|tree| !tree.fetch.is_subset(&t.complete)))
            })
            .map(|(id, _)| *id)
            .collect();
        for task in in_flight {
            self.forget(task);
            self.events.push_back(BcastEvent::Failed {
                task,
                error: BcastError::Revoked,
            });
        }
        // Nothing more goes out but the withdrawals of promised payloads, which end
        // the children's waits for them.
        self.out.retain(|o| matches!(o, Outgoing::Withdrawn { .. }));
    }

    /// The failure view reports `rank` dead: re-attach what depended on it.
    pub fn on_rank_failed(&mut self, _now: Instant, rank: Rank) {
        if rank >= self.cfg.n || rank == self.cfg.me || !self.dead.insert(rank) {
            return;
        }
        // The template's trees and children were derived with `rank` alive.
        self.root_template = None;
        self.out.retain(|o| match o {
            Outgoing::Frame { to, .. }
            | Outgoing::Stream { to, .. }
            | Outgoing::Withdrawn { to, .. } => *to != rank,
        });
        let me = self.cfg.me;
        let task_ids: Vec<TaskId> = self.tasks.keys().copied().collect();
        for id in task_ids {
            let mut requests: Vec<(Rank, u32, OutputSet)> = Vec::new();
            let mut abandoned = false;
            if let Some(t) = self.tasks.get_mut(&id) {
                t.waiting.retain(|w| w.child != rank);
                t.parked.retain(|p| p.to != rank);
                t.served.remove(&rank);
                for (&tree_id, tree) in t.trees.iter_mut() {
                    tree.recompute_direct(me, &self.dead);
                    if tree.parent != me && self.dead.contains(tree.parent) {
                        match tree.ancestors.iter().rposition(|a| !self.dead.contains(*a)) {
                            Some(k) => {
                                tree.parent = tree.ancestors[k];
                                tree.ancestors.truncate(k + 1);
                                let missing = tree.fetch.difference(&t.complete);
                                if !missing.is_empty() {
                                    tree.requested_from = Some(tree.parent);
                                    requests.push((tree.parent, tree_id, missing));
                                }
                            }
                            None => abandoned = true,
                        }
                    }
                }
                if abandoned && !t.abandoned {
                    t.abandoned = true;
                    self.events.push_back(BcastEvent::Abandoned { task: id });
                }
            }
            for (to, tree, outputs) in requests {
                self.send_request(id, to, tree, &outputs);
            }
            self.progress(id);
        }
    }
}
