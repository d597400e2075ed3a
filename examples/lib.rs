//! Examples of the fault-tolerance library, run with
//! `cargo run --release -p ft-examples --example NAME`. Each one asserts on its result.
