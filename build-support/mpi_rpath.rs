//! The build script of the workspace's MPI programs (`ft-examples`, `ft-taskgraph`):
//! with the `mpi` feature, links the package's binaries, examples and tests with an
//! rpath to the MPI library the `mpi` crate builds against (the one `MPICC` names), so
//! they start under that MPI's `mpiexec`, and under `ftrun`, without `LD_LIBRARY_PATH`
//! (MPICH's Hydra sets none).

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    #[cfg(feature = "mpi")]
    match build_probe_mpi::probe() {
        Ok(library) => {
            for dir in &library.lib_paths {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
            }
        }
        Err(_) => println!("cargo:warning=no MPI found for the rpath; set MPICC"),
    }
}
