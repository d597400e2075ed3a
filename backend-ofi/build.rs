//! Generates the libfabric bindings: bindgen over `ofi.h`, with the header's `static inline`
//! calls (almost all of libfabric's API) wrapped in a C file that `cc` compiles, since
//! `libfabric.so` exports only a handful of symbols.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let header = manifest.join("ofi.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");

    // libfabric's include path and link line: pkg-config when it knows the library,
    // the system default (`-lfabric`, headers in /usr/include) otherwise.
    let include_paths = match pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
    {
        Ok(lib) => lib.include_paths,
        Err(e) => {
            println!("cargo:warning=pkg-config found no libfabric ({e}); linking -lfabric");
            println!("cargo:rustc-link-lib=fabric");
            Vec::new()
        }
    };

    let wrappers = out.join("ofi_static_wrappers");
    let mut builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*")
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for path in &include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    builder
        .generate()
        .expect("bindgen could not read the libfabric headers (libfabric-dev, libclang-dev)")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");

    let mut cc = cc::Build::new();
    cc.file(wrappers.with_extension("c")).include(&manifest);
    for path in &include_paths {
        cc.include(path);
    }
    cc.warnings(false).compile("ofi_static_wrappers");
}
