//! Links `backend-mpi`'s binaries and tests with an rpath to the MPI library the `mpi`
//! crate builds against (the one `MPICC` names, `mpicc` by default), so they start
//! without `LD_LIBRARY_PATH`, under any `mpiexec` of that MPI; and tells the code which
//! family that MPI is (`cfg(mpi_family = "openmpi")` or `"mpich"`), whose wrappers
//! answer different flags and whose ULFM calls and error classes differ in name.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo::rustc-check-cfg=cfg(mpi_family, values(\"openmpi\", \"mpich\"))");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_string());
    // Open MPI's wrappers answer `-showme:link`; MPICH's answer `-link_info`.
    for (flag, family) in [("-showme:link", "openmpi"), ("-link_info", "mpich")] {
        let Ok(out) = Command::new(&mpicc).arg(flag).output() else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        for dir in text.split_whitespace().filter_map(|w| w.strip_prefix("-L")) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
        println!("cargo:rustc-cfg=mpi_family=\"{family}\"");
        return;
    }
    println!("cargo:warning=could not ask {mpicc} for its library directories; set MPICC");
}
