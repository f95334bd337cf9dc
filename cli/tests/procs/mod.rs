//! Helpers for the tests that run `tbon daemon` as separate processes. Each test binary uses
//! some of them.
#![allow(dead_code)]

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

/// Runs `tbon harness` with `args` plus `--quiet --json <file>`, asserts that it exited 0, and
/// returns its report and its stdout (for messages).
pub fn harness_report(name: &str, args: &[&str]) -> (serde_json::Value, String) {
    harness_report_env(name, args, &[])
}

/// [`harness_report`] with these variables in the harness's environment (its daemons inherit
/// them: `TBON_<SETTING>` sets a daemon setting).
#[allow(dead_code)]
pub fn harness_report_env(
    name: &str,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (serde_json::Value, String) {
    let json = std::env::temp_dir().join(format!("tbon-{name}-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .arg("harness")
        .args(args)
        .envs(envs.iter().copied())
        .arg("--quiet")
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run tbon harness");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["passed"], true, "{stdout}");
    (report, stdout)
}
