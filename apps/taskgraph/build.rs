//! With the `mpi` feature, links `fttask` with an rpath to the MPI library the `mpi`
//! crate builds against (the one `MPICC` names), so one binary starts under that MPI's
//! `mpiexec` and under `ftrun` alike, without `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    #[cfg(feature = "mpi")]
    match build_probe_mpi::probe() {
        Ok(library) => {
            for dir in &library.lib_paths {
                println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{}", dir.display());
            }
        }
        Err(_) => println!("cargo:warning=no MPI found for the rpath; set MPICC"),
    }
}
