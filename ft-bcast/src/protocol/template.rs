//! The root's start from a plan it started from before.
//!
//! A task runtime starts a broadcast from the same plan for every task of a class (the
//! same destinations, the same output sizes). What the root derives from the plan is
//! then the same each time but for the broadcast's id: its trees (every descendant with
//! its parent, needs and fetch set, and their index), its children's activation frames
//! (the largest subtree first) and the streams pushed to them. The first child's
//! activation waits for all of it, so it lies on every destination's critical path.
//!
//! So the second start from one plan leaves a [`RootTemplate`] behind, and every later
//! start from that plan clones it and writes each frame again around its kept body:
//! the header, the new broadcast's id, the body, and for an activation the length of
//! the new activation header (whose bytes follow as the frame's tail), instead of
//! building and encoding again. (The
//! first start keeps nothing: a plan built for one broadcast and dropped costs no copy.)
//!
//! **Invariants.** A template is exactly what the full start leaves for its plan (the
//! task's trees and served sets, and the frames and streams queued for its children),
//! the broadcast's id and activation header aside: it is captured right after that start, and dropped when
//! anything it was derived from changes besides the plan (a rank's death, a chunk
//! setting, revocation). A plan is immutable and its id names it ([`Plan::id`]), so a
//! template never serves another plan. Only plans whose trees hold at most
//! [`TEMPLATE_MAX_ENTRIES`] descendants in all are kept: a larger root's start is
//! dominated by work per destination either way, and its template would double its
//! memory.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use hashbrown::HashMap;

use bytes::Bytes;
use ft_core::wire::{FrameKind, Header, HEADER_LEN};
use ft_core::Rank;

use super::codec::varint_len;
use super::state::{IdMap, Outgoing, Task, TreeState};
use super::TaskId;
use crate::outputs::OutputSet;
use crate::plan::Plan;

/// The most descendants (over all trees) of a plan whose start is kept as a template.
const TEMPLATE_MAX_ENTRIES: usize = 1024;

/// What the root's full start from one plan left, for the next start from it.
#[derive(Debug)]
pub(super) struct RootTemplate {
    /// The plan's id.
    plan: usize,
    trees: IdMap<TreeState>,
    served: HashMap<Rank, OutputSet>,
    /// The frames and streams queued for the children, in order.
    out: Vec<Queued>,
}

/// A frame or stream the full start queued for a child.
#[derive(Debug)]
enum Queued {
    /// A frame, by what does not change from one start to the next: its header and
    /// what follows the broadcast's id (for an activation, up to the activation
    /// header's length, which ends it).
    Frame {
        to: Rank,
        header: Header,
        body: Vec<u8>,
    },
    /// A stream of output `output` from `offset` in chunks of at most `chunk` bytes.
    Stream {
        to: Rank,
        output: u32,
        offset: u64,
        chunk: usize,
    },
}

impl RootTemplate {
    /// The template of broadcast `id` (its state `task`), just started from `plan` by
    /// the full path, which queued `queued` (its children's frames, headed `head`
    /// but for their kind, and streams); `None` if the plan is too large to keep.
    pub(super) fn capture<'a>(
        plan: &Plan,
        id: TaskId,
        task: &Task,
        head: Header,
        queued: impl Iterator<Item = &'a Outgoing>,
    ) -> Option<Box<RootTemplate>> {
        let entries: usize = task.trees.values().map(|t| t.entries.len()).sum();
        if entries > TEMPLATE_MAX_ENTRIES {
            return None;
        }
        let mut out = Vec::new();
        for o in queued {
            out.push(match o {
                Outgoing::Frame { to, bytes, tail } => {
                    let kind = FrameKind::from_code(*bytes.get(1)?).ok()?;
                    let start = HEADER_LEN + id.wire_len();
                    let end = if kind == FrameKind::BcastActivate {
                        bytes.len().checked_sub(varint_len(tail.len() as u64))?
                    } else {
                        bytes.len()
                    };
                    Queued::Frame {
                        to: *to,
                        header: Header { kind, ..head },
                        body: bytes.get(start..end)?.to_vec(),
                    }
                }
                &Outgoing::Stream {
                    to,
                    output,
                    offset,
                    chunk,
                    ..
                } => Queued::Stream {
                    to,
                    output,
                    offset,
                    chunk,
                },
                // (A root holds its data: it promises nothing, so withdraws nothing.)
                Outgoing::Withdrawn { .. } => return None,
            });
        }
        Some(Box::new(RootTemplate {
            plan: plan.id(),
            trees: task.trees.clone(),
            served: task.served.clone(),
            out,
        }))
    }

    /// Whether this template is `plan`'s.
    pub(super) fn serves(&self, plan: &Plan) -> bool {
        self.plan == plan.id()
    }

    /// Fills `task_state` (its sizes, buffers and header set from the start's
    /// arguments) with the template's trees and served sets, and queues the template's
    /// frames and streams on `out` as broadcast `task`'s.
    pub(super) fn start(&self, task: TaskId, task_state: &mut Task, out: &mut VecDeque<Outgoing>) {
        task_state.trees = self.trees.clone();
        task_state.served = self.served.clone();
        let header = &task_state.header;
        out.extend(self.out.iter().map(|q| match q {
            Queued::Frame {
                to,
                header: head,
                body,
            } => {
                let mut w = head.start();
                task.put(&mut w);
                w.put_raw(body);
                let activation = head.kind == FrameKind::BcastActivate;
                if activation {
                    w.put_varint(header.len() as u64);
                }
                Outgoing::Frame {
                    to: *to,
                    bytes: w.finish(),
                    tail: if activation {
                        header.clone()
                    } else {
                        Bytes::new()
                    },
                }
            }
            &Queued::Stream {
                to,
                output,
                offset,
                chunk,
            } => Outgoing::Stream {
                to,
                task,
                output,
                offset,
                chunk,
                promise: None,
            },
        }));
    }
}
