//! Helpers for the tests that run `tbon daemon` as separate processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A job key file for this test binary's DVMs, made the way users make one (`tbon keygen`).
pub fn keygen_file() -> &'static Path {
    static KEY: OnceLock<PathBuf> = OnceLock::new();
    KEY.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("tbon-key-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let st = Command::new(env!("CARGO_BIN_EXE_tbon"))
            .arg("keygen")
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success(), "tbon keygen failed");
        p
    })
}
