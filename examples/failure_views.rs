//! Failure views on the simulator: 32 ranks, two die, the survivors validate globally,
//! then one survivor queries states, recognizes a failure and renumbers the shrunk group.
//!
//! Run: `cargo run --release -p ft-examples --example failure_views`

use backend_sim::engine::Sim;
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use ft_core::node::Node;
use ft_core::shrink::Survivors;
use ft_core::{RankInfo, RankState, Scope, StateMask, ViewError};

fn main() {
    let scenario = Scenario::from_json(
        r#"{ "ranks": 32, "seed": 1,
             "network": { "latency_us": 1.5, "gbytes_per_s": 10.0 },
             "detector": { "period_ms": 10, "timeout_ms": 40 },
             "kill": [ { "rank": 5, "at_ms": 3.0 }, { "rank": 9, "at_ms": 7.0 } ],
             "actions": [ { "at_ms": 120, "validate_global": {} } ],
             "until_ms": 200 }"#,
    )
    .expect("a valid scenario");
    let mut sim: Sim<Node> = Sim::new(&scenario, make_node).expect("simulator");
    sim.run_to_end(|_| {}).expect("the run settles");

    let view = sim.machine(0).view();
    println!("rank 0: L_i = {:?}, G = {:?}", view.local(), view.global());

    // Ask for the newly agreed failures with a buffer that is too small: the error names
    // the size needed and the buffer is left alone.
    let failed_new = StateMask::FAILED | StateMask::NEW;
    let mut small = [RankInfo {
        rank: 0,
        state: RankState::Ok,
        epoch: 0,
        generation: 0,
    }; 1];
    let needed = match view.get_state(Scope::Global, failed_new, &mut small) {
        Err(ViewError::BufferTooSmall { needed }) => needed,
        other => panic!("expected a too-small buffer, got {other:?}"),
    };
    assert_eq!(needed, 2);
    let mut rows = vec![small[0]; needed];
    let count = view
        .get_state(Scope::Global, failed_new, &mut rows)
        .expect("big enough");
    println!("newly agreed failures: {:?}", &rows[..count]);
    assert_eq!(rows.iter().map(|r| r.rank).collect::<Vec<_>>(), [5, 9]);
    assert!(rows
        .iter()
        .all(|r| r.state == RankState::Failed && r.epoch == 1));

    // The application deals with rank 5: it becomes NULL.
    let node = sim.machine_mut(0);
    node.recognize(5).expect("5 is failed");
    assert_eq!(node.view().num_state(Scope::Global, StateMask::NULL), 1);
    assert_eq!(node.view().num_state(Scope::Global, StateMask::OK), 30);

    // Shrink: survivors keep their order in the new, smaller communicator.
    let survivors = Survivors::new(node.view().global());
    assert_eq!(survivors.len(), 30);
    assert_eq!(survivors.new_rank(10), Some(8));
    assert_eq!(survivors.new_rank(9), None);
    println!("shrunk communicator: 30 ranks; old rank 10 is new rank 8");
}
