//! `include/tbon.h` (at the repository root) must be exactly what cbindgen generates from this
//! package's `src/lib.rs` with `capi/cbindgen.toml`. After changing the C API, regenerate it with
//! `TBON_BLESS=1 cargo test --release --test c_header` and commit the header. The header also
//! compiles as strict C99 and C11 with every warning an error.

use std::path::Path;

/// The repository's root, where `include/` and `tbon.pc` live (this package is `capi/`).
fn repository_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("capi/ has a parent")
}

#[test]
fn committed_header_matches_a_fresh_generation() {
    let capi = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = repository_root();
    let config = cbindgen::Config::from_file(capi.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        // `lib.rs` names `mod streams;`: cbindgen reads `streams.rs` through it.
        .with_src(capi.join("src/lib.rs"))
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut fresh);
    let path = root.join("include/tbon.h");
    if std::env::var_os("TBON_BLESS").is_some_and(|v| v == "1") {
        // Through a rename: the compile test below reads the header at the same time, and
        // must never see it half written.
        let tmp = root.join(format!("include/.tbon.h.{}", std::process::id()));
        std::fs::write(&tmp, &fresh).expect("write include/tbon.h");
        std::fs::rename(&tmp, &path).expect("rename to include/tbon.h");
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
    let root = repository_root();
    let pc = std::fs::read_to_string(root.join("tbon.pc")).expect("tbon.pc");
    let want = format!("Version: {}", env!("CARGO_PKG_VERSION"));
    assert!(
        pc.lines().any(|l| l.trim() == want),
        "tbon.pc must say `{want}`"
    );
}

/// The header alone compiles as strict C99 with every warning an error (and as C11), so any C
/// project can include it whatever its flags. Needs a C compiler (`cc`, or `$CC`), as the C
/// examples do.
#[test]
fn header_compiles_as_strict_c99_and_c11() {
    let root = repository_root();
    let dir = std::env::temp_dir().join(format!("tbon-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("include_only.c");
    std::fs::write(
        &src,
        "#include \"tbon.h\"\nint main(void) { return TBON_OK; }\n",
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for std in ["-std=c99", "-std=c11"] {
        let out = std::process::Command::new(&cc)
            .args([std, "-Wall", "-Wextra", "-pedantic", "-Werror", "-c"])
            .arg("-I")
            .arg(root.join("include"))
            .arg(&src)
            .arg("-o")
            .arg(dir.join("include_only.o"))
            .output()
            .expect("run the C compiler");
        assert!(
            out.status.success(),
            "tbon.h with {std} -Wall -Wextra -pedantic -Werror:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
