//! One rank of an MPI job, opened over `MPI_COMM_WORLD` with `ft::mpi::open`. With
//! `--kill R`, rank `R` dies by SIGKILL after a first validation; the others wait until
//! their detector declares it, agree on `G` with `validate_global`, and each prints one
//! line; then the survivors send each other messages in a ring (`ft_examples::run_job`)
//! and print a second line. Without `--kill`, every rank prints `G = []`: the failure-free run that any MPI
//! passes, MPICH's included.
//!
//! Run (`MPICC` names the MPI): `cargo build --release -p ft-examples --features ft-examples/mpi --example mpi_validate`,
//! then `mpiexec --with-ft ulfm -n 4 target/release/examples/mpi_validate --kill 3`
//! (Open MPI 5), or `mpiexec -n 4 target/release/examples/mpi_validate` (any MPI).

use std::time::Duration;

use ft::Settings;
use mpi::environment::Threading;

fn main() {
    let kill = ft_examples::kill_flag("mpi_validate");
    let (universe, threading) =
        mpi::initialize_with_threading(Threading::Multiple).expect("MPI initializes once");
    assert!(
        threading >= Threading::Serialized,
        "MPI offers {threading:?}"
    );
    let handle = ft::mpi::open(&universe.world(), &Settings::default()).expect("the rank opens");
    ft_examples::run_job(&handle, kill);
    handle
        .shutdown(Duration::from_millis(200))
        .expect("shut down");
    if kill.is_some() {
        // Open MPI 5 may wait forever in MPI_Finalize for the dead process (its PMIx
        // fence, open-mpi/ompi#11404): a survivor that saw a failure exits without it.
        std::process::exit(0);
    }
    drop(universe);
}
