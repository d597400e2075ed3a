//! Temporary: cost of the stack vs the node alone (deleted after measuring).
use backend_sim::engine::Sim;
use backend_sim::failure::make_node;
use backend_sim::scenario::Scenario;
use backend_sim::stack::SimStack;
use ft_core::node::Node;

#[test]
#[ignore]
fn cost() {
    let path = std::env::var("SCEN").unwrap();
    let s = Scenario::from_file(std::path::Path::new(&path)).unwrap();
    eprintln!("size_of Node {} SimStack {}", std::mem::size_of::<Node>(), std::mem::size_of::<SimStack>());
    for round in 0..2 {
        let t = std::time::Instant::now();
        let mut sim: Sim<Node> = Sim::new(&s, make_node).unwrap();
        sim.run_to_end(|_| {}).unwrap();
        eprintln!("round {round} node:  {:.2} s, {} events", t.elapsed().as_secs_f64(), sim.log().events);
        drop(sim);
        let t = std::time::Instant::now();
        let mut sim: Sim<SimStack> = Sim::new(&s, SimStack::factory(&s)).unwrap();
        sim.run_to_end(|_| {}).unwrap();
        eprintln!("round {round} stack: {:.2} s, {} events", t.elapsed().as_secs_f64(), sim.log().events);
    }
}
