//! One rank of a libfabric job, opened from its launcher's environment: under `ftrun`,
//! `mpiexec` or srun alike (`ft::ofi::open_from_env`). With `--kill R`, rank `R` dies by
//! a signal once it is connected; the others wait until their detector declares it,
//! agree on `G` with `validate_global`, and each prints one line; then the survivors
//! send each other messages in a ring (`ft_examples::run_job`) and print a second line.
//!
//! Run: `cargo build --release -p ft-launch --bin ftrun -p ft-examples --features ft-examples/ofi --example ofi_validate`,
//! then `target/release/ftrun -n 4 -- target/release/examples/ofi_validate --kill 2`.

use std::time::Duration;

use ft::Settings;

fn main() {
    let kill = ft_examples::kill_flag("ofi_validate");
    let handle = ft::ofi::open_from_env(&Settings::default()).expect("the rank opens");
    ft_examples::run_job(&handle, kill);
    handle
        .shutdown(Duration::from_millis(200))
        .expect("shut down");
}
