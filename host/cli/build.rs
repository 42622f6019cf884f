// Links the `cro` executable with packed relative relocations (DT_RELR) where the C
// library it is built against can load them.
//
// A position-independent executable carries one 24-byte relocation for every pointer in
// its read-only data (vtables, static string tables): about 89,000 of them, 2.1 MB for
// `cro`, read in full by the dynamic loader at every start and then resident for the
// process's life. Packed (`-z pack-relative-relocs`) the same table is 23 KB, and the
// operator idles 2.5 to 5 MiB smaller (docs/BENCHMARKS.md, "Packed relocations") while
// keeping address-space randomisation, which a non-PIE link would give up for the same
// saving.
//
// glibc loads packed relocations from 2.36 on, and the linker marks the executable as
// needing them (`GLIBC_ABI_DT_RELR`), so on an older C library it refuses to start with
// that name rather than run with pointers unrelocated. Packing is therefore asked for
// only when building for the machine that builds (host and target the same) and that
// machine's glibc is 2.36 or newer: a binary built elsewhere, or cross-compiled, links
// as before. `CRO_PACK_RELOCS=0` turns it off (for a binary to be copied to an older
// system); `=1` forces it (cross builds for a target known to be new enough).
//
// `tests/bench` includes this file: the benchmark measures the operator's memory in its
// own executable, which must be linked the way `cro` is.

fn main() {
    // Rerun on the variable alone (a change to this file rebuilds the script anyway).
    println!("cargo:rerun-if-env-changed=CRO_PACK_RELOCS");
    let wanted = match std::env::var("CRO_PACK_RELOCS").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        Ok(other) => {
            println!(
                "cargo:warning=CRO_PACK_RELOCS={other} is neither 0 nor 1; packing where supported"
            );
            supported_here()
        }
        Err(_) => supported_here(),
    };
    if wanted {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the target is this very glibc system and its glibc loads DT_RELR (2.36+).
fn supported_here() -> bool {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let glibc_target =
        var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu";
    glibc_target && var("HOST") == var("TARGET") && host_glibc().is_some_and(|v| v >= (2, 36))
}

/// The (major, minor) version of the glibc this build script runs on.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn host_glibc() -> Option<(u32, u32)> {
    unsafe extern "C" {
        // glibc's own report of its version, e.g. "2.36" (gnu/libc-version.h).
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    // SAFETY: glibc returns a pointer to a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let mut parts = version.to_str().ok()?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some((major, minor))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn host_glibc() -> Option<(u32, u32)> {
    None
}
