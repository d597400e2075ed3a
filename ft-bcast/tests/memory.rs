//! Memory a rank holds per in-flight broadcast beyond the payloads themselves (issue 14,
//! "must show"), counted with a counting global allocator.
//!
//! A set of [`Broadcaster`]s on one communicator runs one broadcast; frames go FIFO.
//! Every call into rank `r`'s machine (`start_broadcast`, `handle_message`,
//! `poll_transmit`, `poll_event`) is bracketed by a reading of the live heap bytes, and
//! the difference is charged to `r`: a machine allocates and frees only its own state
//! inside its calls (frames are written into the caller's buffer and copied out by the
//! test, outside the brackets). So `charged[r]` is what `r` holds for the broadcast;
//! minus its payload bytes ([`Broadcaster::held_bytes`]; the root's payloads are built
//! inside its bracket, and received buffers grow to exactly their size here since every
//! output fits one chunk) it is the overhead: task state, tree entries, indexes, queues.
//!
//! The figures (`--nocapture`) are printed for the root, the largest relay and the
//! largest leaf, both settled (every destination released, before `forget`) and at
//! their peak between calls. The test asserts the design's bound: the state grows with
//! the subtree entries a rank knows (the root knows every edge, a relay its subtree, a
//! leaf none) at most [`BYTES_PER_ENTRY`] each, plus [`BYTES_PER_TREE`] per tree the
//! rank is in and [`BYTES_PER_TASK`]; and `forget` gives back all but the queues'
//! capacity ([`BYTES_KEPT`]). Nothing is timed.
//!
//! One test per file: the counter is process-wide.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use ft_bcast::{BcastEvent, Broadcaster, Config, Plan, PlanSpec};
use ft_core::{wire, Instant, Protocol, Rank};

#[path = "../benches/shape/mod.rs"]
mod shape;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as for `dealloc`; the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes of state per subtree entry a rank knows: the entry (child, parent, needs and
/// fetch sets: 56 bytes), its slot in the rank → entry index, the `direct` list, with
/// the vectors' and tables' growth slack (up to twice).
const BYTES_PER_ENTRY: usize = 256;
/// Bytes per tree the rank is in (its tree state, ancestors, tables' empty headers).
const BYTES_PER_TREE: usize = 1024;
/// Bytes per task: the task's state (boxed, about 250 bytes) and its vectors of output
/// sizes, buffers and trees (`protocol::state::IdMap`).
const BYTES_PER_TASK: usize = 2 << 10;
/// Bytes a machine may keep after `forget`: the task map's emptied root node (11
/// slots of a task id and a box) and its queues' capacity (32 queued frames or
/// streams of about 72 bytes each).
const BYTES_KEPT: isize = 3 << 10;

/// Payload bytes of every output.
const PAYLOAD: u64 = 64;

/// Runs `f` and charges the change in live heap bytes to `charged`.
fn charge<R>(charged: &mut isize, f: impl FnOnce() -> R) -> R {
    let before = LIVE.load(Ordering::Relaxed);
    let result = f();
    *charged += LIVE.load(Ordering::Relaxed) - before;
    result
}

/// The bench's task shape (destination `i` of `d` needs output `j` when
/// `(7i + 3j) mod 4 ≠ 0`) over `n` ranks, outputs of [`PAYLOAD`] bytes.
fn spec(n: u32, d: u32, m: u32) -> PlanSpec {
    shape::spec(n, &shape::lists(n, d, m), PAYLOAD)
}

/// What each rank knows of the plan: the subtree entries it holds (summed over its
/// trees; the root holds every edge) and the trees it is in.
fn knowledge(plan: &Plan) -> (HashMap<Rank, usize>, HashMap<Rank, usize>) {
    let root = plan.spec().root;
    let mut entries: HashMap<Rank, usize> = HashMap::new();
    let mut trees: HashMap<Rank, usize> = HashMap::new();
    for t in 0..plan.trees().len() {
        let edges: Vec<_> = plan.tree_edges(t).collect();
        *trees.entry(root).or_default() += 1;
        *entries.entry(root).or_default() += edges.len();
        // Subtree sizes, children before parents (edges are parent-first).
        let mut below: HashMap<Rank, usize> = HashMap::new();
        for e in edges.iter().rev() {
            let own = below.get(&e.child).copied().unwrap_or(0);
            *below.entry(e.parent).or_default() += own + 1;
            *trees.entry(e.child).or_default() += 1;
            *entries.entry(e.child).or_default() += own;
        }
    }
    (entries, trees)
}

/// One rank's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    settled: isize,
    peak: isize,
    entries: usize,
    trees: usize,
    after_forget: isize,
}

/// Runs one broadcast of `spec` over `spec.ranks` machines; returns each role's
/// figures (root, the relay and the leaf holding the most) and the plan's own bytes.
fn measure(spec: PlanSpec) -> (Held, Held, Held, isize) {
    let n = spec.ranks;
    let root = spec.root;
    let mut nodes: Vec<Broadcaster> = (0..n)
        .map(|me| Broadcaster::new(Config::new(7, n, me)))
        .collect();
    let mut plan_bytes = 0;
    let plan = charge(&mut plan_bytes, || Plan::build(spec).expect("valid spec"));
    let (entries, trees) = knowledge(&plan);
    let parents: std::collections::HashSet<Rank> = plan.edges().map(|e| e.parent).collect();
    let destinations = plan.classes().destinations();

    let mut charged = vec![0isize; n as usize];
    let mut peak = vec![0isize; n as usize];
    let mut buf = vec![0u8; wire::frame_capacity(n)];
    let mut wire: VecDeque<(Rank, Rank, Vec<u8>)> = VecDeque::new();
    let mut released = 0usize;
    // Drains rank `r`'s frames and events, charging each call to it.
    let mut drain = |r: Rank,
                     node: &mut Broadcaster,
                     charged: &mut isize,
                     wire: &mut VecDeque<(Rank, Rank, Vec<u8>)>,
                     released: &mut usize| {
        while let Some(t) = charge(charged, || {
            node.poll_transmit(Instant::ZERO, &mut buf)
                .expect("the buffer holds frame_capacity bytes")
        }) {
            wire.push_back((r, t.to, buf[..t.len].to_vec()));
        }
        while let Some(e) = charge(charged, || node.poll_event()) {
            *released += usize::from(matches!(e, BcastEvent::Released { .. }));
        }
    };

    let outputs = plan.spec().outputs.len();
    charge(&mut charged[root as usize], || {
        let payloads: Vec<Vec<u8>> = (0..outputs)
            .map(|j| vec![j as u8; PAYLOAD as usize])
            .collect();
        nodes[root as usize]
            .start_broadcast(Instant::ZERO, 1, &plan, payloads)
            .expect("root of the plan")
    });
    drain(
        root,
        &mut nodes[root as usize],
        &mut charged[root as usize],
        &mut wire,
        &mut released,
    );
    peak[root as usize] = charged[root as usize];
    let mut steps = 0usize;
    while let Some((from, to, frame)) = wire.pop_front() {
        let r = to as usize;
        charge(&mut charged[r], || {
            nodes[r].handle_message(Instant::ZERO, from, &frame)
        })
        .expect("a well-formed frame");
        drain(to, &mut nodes[r], &mut charged[r], &mut wire, &mut released);
        peak[r] = peak[r].max(charged[r]);
        steps += 1;
        assert!(
            steps < 100 * (n as usize + 1) * (outputs + 1),
            "the broadcast does not settle"
        );
    }
    // One release per tree a destination is in (per-class: one each).
    assert_eq!(
        released, destinations,
        "every destination released its outputs"
    );

    let overhead = |r: usize, bytes: isize| bytes - nodes[r].held_bytes() as isize;
    let mut held: Vec<Held> = (0..n as usize)
        .map(|r| Held {
            settled: overhead(r, charged[r]),
            peak: overhead(r, peak[r]),
            entries: entries.get(&(r as Rank)).copied().unwrap_or(0),
            trees: trees.get(&(r as Rank)).copied().unwrap_or(0),
            after_forget: 0,
        })
        .collect();
    for (r, node) in nodes.iter_mut().enumerate() {
        charge(&mut charged[r], || {
            node.forget(ft_bcast::TaskId::new(root, 1))
        });
        held[r].after_forget = charged[r];
    }
    for (r, h) in held.iter().enumerate() {
        if h.trees == 0 {
            continue;
        }
        let bound = BYTES_PER_ENTRY * h.entries + BYTES_PER_TREE * h.trees + BYTES_PER_TASK;
        assert!(
            h.settled.max(h.peak) <= bound as isize,
            "rank {r} holds {h:?} beyond its payloads, over the bound of {bound} bytes"
        );
        assert!(
            h.after_forget <= BYTES_KEPT,
            "rank {r} keeps {} bytes after forget",
            h.after_forget
        );
    }
    let largest = |pick: &dyn Fn(usize) -> bool| {
        (0..n as usize)
            .filter(|&r| pick(r))
            .map(|r| held[r])
            .max_by_key(|h| h.settled)
            .unwrap_or_default()
    };
    let is_dest = |r: usize| r != root as usize && held[r].trees > 0;
    let relay = largest(&|r| is_dest(r) && parents.contains(&(r as Rank)));
    let leaf = largest(&|r| is_dest(r) && !parents.contains(&(r as Rank)));
    (held[root as usize], relay, leaf, plan_bytes)
}

/// Heap allocations of writing the bench's spec of `d` × `m` (`benches/small_tasks.rs`)
/// and of building its plan.
fn plan_allocations(d: u32, m: u32) -> (usize, usize) {
    let count = |f: &mut dyn FnMut()| {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        f();
        ALLOCATIONS.load(Ordering::Relaxed) - before
    };
    let lists = shape::lists(1024, d, m);
    let mut written = None;
    let spec_allocations = count(&mut || written = Some(shape::spec(1024, &lists, PAYLOAD)));
    let mut plan = None;
    let build = count(&mut || {
        plan = written.take().map(|s| Plan::build(s).expect("valid spec"));
    });
    assert!(plan.is_some());
    (spec_allocations, build)
}

/// Allocations of `Plan::build` for 16 × 4: 2 for the refinement's rank list, class
/// sets, offsets and members (4), the plan's sets and trees (2).
const PLAN_ALLOCATIONS_16X4: usize = 6;

#[test]
fn state_per_broadcast_grows_with_the_subtree_a_rank_knows() {
    println!(
        "| task (ranks, destinations × outputs) | plan | root | per edge at the root | largest relay | largest leaf | kept after forget (root, leaf) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (n, d, m) in [
        (1024, 16, 4),
        (1024, 64, 4),
        (1025, 1024, 4),
        (1025, 1024, 1),
    ] {
        let (root, relay, leaf, plan) = measure(spec(n, d, m));
        let peak = |h: Held| {
            if h.peak > h.settled {
                format!(" (peak {})", h.peak)
            } else {
                String::new()
            }
        };
        println!(
            "| {n}, {d} × {m} | {plan} B | {} B{} ({} edges) | {} B | {} B{} ({} entries) | {} B{} | {} B, {} B |",
            root.settled,
            peak(root),
            root.entries,
            root.settled / root.entries.max(1) as isize,
            relay.settled,
            peak(relay),
            relay.entries,
            leaf.settled,
            peak(leaf),
            root.after_forget,
            leaf.after_forget,
        );
    }
    println!();
    println!("| task | allocations writing the spec | allocations in Plan::build |");
    println!("|---|---|---|");
    for (d, m) in [(8, 1), (16, 4), (16, 8), (64, 4)] {
        let (spec, build) = plan_allocations(d, m);
        println!("| {d} × {m} | {spec} | {build} |");
        if (d, m) == (16, 4) {
            assert!(
                build <= PLAN_ALLOCATIONS_16X4,
                "Plan::build of 16 × 4 allocates {build} times"
            );
        }
    }
}
