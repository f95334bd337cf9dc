//! `include/tbon.h` must be exactly what cbindgen generates from `src/ffi/mod.rs` with
//! `cbindgen.toml`. After changing the C API, regenerate it with
//! `TBON_BLESS=1 cargo test --release --test c_header` and commit the header.

use std::path::Path;

#[test]
fn committed_header_matches_a_fresh_generation() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        // `mod.rs` names `mod streams;`: cbindgen reads `streams.rs` through it.
        .with_src(root.join("src/ffi/mod.rs"))
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut fresh);
    let path = root.join("include/tbon.h");
    if std::env::var_os("TBON_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("write include/tbon.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/tbon.h is stale: regenerate it with `TBON_BLESS=1 cargo test --release --test c_header` and commit it"
    );
}

/// `tbon.pc` (pkg-config) states the crate's version.
#[test]
fn pkg_config_file_has_the_crate_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pc = std::fs::read_to_string(root.join("tbon.pc")).expect("tbon.pc");
    let want = format!("Version: {}", env!("CARGO_PKG_VERSION"));
    assert!(
        pc.lines().any(|l| l.trim() == want),
        "tbon.pc must say `{want}`"
    );
}
