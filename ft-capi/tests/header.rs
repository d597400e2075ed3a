//! The committed header `include/ft.h` is what cbindgen generates from the sources now:
//! this test regenerates it and fails, with a diff summary, when the two differ (set
//! `FT_BLESS_HEADER=1` to write the new header instead).

use std::path::Path;

#[test]
fn the_committed_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("include/ft.h");
    if std::env::var_os("FT_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/ft.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "ft-capi/include/ft.h is stale (first difference at line {}: committed {:?}, \
             generated {:?}); regenerate it with \
             `FT_BLESS_HEADER=1 cargo test -p ft-capi --test header` and commit it",
            first + 1,
            committed.lines().nth(first),
            generated.lines().nth(first)
        );
    }
}
