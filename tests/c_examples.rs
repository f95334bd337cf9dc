//! The C examples (`examples/c/*.c`), built with the system C compiler (`cc`, or `$CC`) against
//! the `libtbon.so` that cargo built for this test run, and run. Each checks its own results and
//! exits non-zero on any failure.
//!
//! The library: cargo builds the `cdylib` with the library this test links, into the test
//! binary's own directory (`target/<profile>/deps/libtbon.so`; a `cdylib` has no hash in its
//! name) or, when uplifted, `target/<profile>/`. If neither exists, the test runs
//! `cargo build --lib` for the same profile and target directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Generous: a guard against hangs only.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn find_lib(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .find(|d| d.join("libtbon.so").is_file())
        .cloned()
}

/// The directory holding the `libtbon.so` of this build.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let deps = exe.parent().expect("test binary directory").to_path_buf();
        let profile_dir = deps.parent().expect("profile directory").to_path_buf();
        let dirs = [deps.clone(), profile_dir.clone()];
        if let Some(d) = find_lib(&dirs) {
            return d;
        }
        let profile = profile_dir
            .file_name()
            .and_then(|p| p.to_str())
            .unwrap_or("debug");
        let target_dir = profile_dir.parent().expect("target directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--lib", "--target-dir"]).arg(target_dir);
        match profile {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        let status = cmd.status().expect("run cargo build --lib");
        assert!(status.success(), "cargo build --lib failed");
        find_lib(&dirs).expect("libtbon.so not found after cargo build --lib")
    })
}

/// Compiles `examples/c/<name>.c` into the test binary's directory and returns the executable.
fn build_example(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let out = lib.join(format!("c-example-{name}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join(format!("examples/c/{name}.c")))
        .arg("-L")
        .arg(lib)
        .arg("-ltbon")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        output.status.success(),
        "{cc} failed on {name}.c:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Runs an example to completion (hang guard: kill after [`HANG_GUARD`]) and checks exit 0.
fn run_example(name: &str) {
    let exe = build_example(name);
    let mut child = Command::new(&exe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > HANG_GUARD {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait_with_output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(stdout.contains(&format!("{name}: ok")), "{name}: {stdout}");
}

#[test]
fn c_ring_passes_the_token_1000_times() {
    run_example("ring");
}

#[test]
fn c_fault_survivors_see_the_fault_and_keep_talking() {
    run_example("fault");
}
