//! Gives `libft.so` the SONAME `libft.so.1` on ELF targets, so that a program linked
//! with `-lft` records which ABI it needs (`scripts/install-capi` installs `libft.so.1`
//! and the `libft.so` link to it). The number is the version of the C ABI of
//! `include/ft.h`: it changes with every change that breaks programs linked before.

/// The C ABI version in the SONAME.
const ABI_VERSION: u32 = 1;

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let family = std::env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    let mach_o = matches!(
        os.as_str(),
        "macos" | "ios" | "tvos" | "watchos" | "visionos"
    );
    if family == "unix" && !mach_o {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libft.so.{ABI_VERSION}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
