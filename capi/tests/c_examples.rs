//! The C examples (`examples/c/*.c`), built with the system C compiler (`cc`, or `$CC`) against
//! the `libtbon.so` that cargo built for this test run, and run; and the Rust resource manager
//! (`examples/resource_manager.rs`), built with `cargo build --example` and run. Each checks
//! its own results and exits non-zero on any failure.
//!
//! The library: the test runs `cargo build -p tbon-capi` for its own profile and target
//! directory (derived from the test binary's path, `target/<profile>/deps/`), a no-op when the
//! library is fresh, and links `target/<profile>/libtbon.so`. (The copy cargo leaves in `deps/` while
//! building tests is not always rebuilt, so it may be stale.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository's root, where `examples/` lives (this package is `capi/`).
fn repository_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("capi/ has a parent")
}

/// Generous: a guard against hangs only.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// The directory holding this build's `libtbon.so`: `cargo build -p tbon-capi` for the test binary's
/// profile and target directory (a no-op when it is fresh), then `target/<profile>/`.
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| cargo_build(&["-p", "tbon-capi"]))
}

/// Runs `cargo build ARGS` for the test binary's profile and target directory and returns
/// `target/<profile>/`.
fn cargo_build(what: &[&str]) -> PathBuf {
    {
        let exe = std::env::current_exe().expect("current_exe");
        let deps = exe.parent().expect("test binary directory");
        let profile_dir = deps.parent().expect("profile directory").to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|p| p.to_str())
            .unwrap_or("debug");
        let target_dir = profile_dir.parent().expect("target directory");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.arg("build")
            .args(what)
            .arg("--target-dir")
            .arg(target_dir);
        match profile {
            "debug" => {}
            "release" => {
                cmd.arg("--release");
            }
            other => {
                cmd.args(["--profile", other]);
            }
        }
        cmd.current_dir(repository_root());
        let status = cmd.status().expect("run cargo build");
        assert!(status.success(), "cargo build {what:?} failed");
        if what == ["-p", "tbon-capi"] {
            assert!(
                profile_dir.join("libtbon.so").is_file(),
                "no libtbon.so in {}",
                profile_dir.display()
            );
        }
        profile_dir
    }
}

/// Compiles `examples/c/<name>.c` into the test binary's directory and returns the executable.
fn build_example(name: &str) -> PathBuf {
    build_c(
        &format!("examples/c/{name}.c"),
        &format!("c-example-{name}"),
    )
}

/// Compiles the C program at `source` (relative to the repository) into the test binary's
/// directory as `exe_name` and returns the executable.
fn build_c(source: &str, exe_name: &str) -> PathBuf {
    let root = repository_root();
    let lib = lib_dir();
    let out = lib.join(exe_name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let output = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"])
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join(source))
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
        "{cc} failed on {source}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// Runs an example to completion (hang guard: kill after [`HANG_GUARD`]) and checks exit 0.
fn run_example(name: &str) {
    run_program(name, &build_example(name), &[]);
}

/// Runs `exe` with a job key in `TBON_KEY_FILE`; it must exit 0 printing "`name`: ok".
fn run_program(name: &str, exe: &Path, args: &[&str]) {
    let key = std::env::temp_dir().join(format!("tbon-c-{}-{name}.key", std::process::id()));
    std::fs::write(&key, "c-examples-job-key-0123456789").expect("write the key");
    let mut child = Command::new(exe)
        .args(args)
        .env("TBON_KEY_FILE", &key)
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
fn rust_resource_manager_starts_daemons_as_processes() {
    let exe = cargo_build(&["-p", "tbon", "--example", "resource_manager"])
        .join("examples/resource_manager");
    run_program("resource_manager", &exe, &["5"]);
}

#[test]
fn c_launch_forms_a_dvm_of_processes_through_a_uri_file() {
    run_example("launch");
}

#[test]
fn c_grow_joins_two_ranks_and_one_leaves_in_order() {
    run_example("grow");
}

#[test]
fn c_ring_passes_the_token_1000_times() {
    run_example("ring");
}

#[test]
fn c_fault_survivors_see_the_fault_and_keep_talking() {
    run_example("fault");
}

#[test]
fn c_batch_sends_200000_small_messages_in_order() {
    run_example("batch");
}

#[test]
fn c_direct_link_between_two_leaves_keeps_order_and_skips_the_relays() {
    run_example("direct");
}

#[test]
fn c_stream_fetches_a_file_sized_object_and_tells_every_end_apart() {
    run_example("stream");
}

#[test]
fn c_status_shows_the_dvm_to_the_daemon_and_to_an_operator() {
    run_example("status");
}

#[test]
fn c_group_two_jobs_on_overlapping_daemons_run_their_own_collectives() {
    run_example("group");
}

#[test]
fn c_modex_two_jobs_exchange_endpoints_by_full_and_direct_fence() {
    run_example("modex");
}

#[test]
fn c_client_processes_of_two_jobs_talk_through_their_daemons() {
    run_example("client");
}

/// In a forked child the parent's handles are `TBON_ERR_BAD_HANDLE` (no send into the void,
/// no panic, no hang), the child may start its own daemon, and lengths past every bound are
/// `TBON_ERR_TOO_LARGE` before anything is read (see the program's comment).
#[test]
fn c_a_forked_child_and_lengths_past_the_bounds_get_errors() {
    let exe = build_c("capi/tests/c/fork_and_bounds.c", "c-test-fork_and_bounds");
    run_program("fork_and_bounds", &exe, &[]);
}

/// A C daemon is not killed by SIGPIPE when local processes abandon connections to its client
/// socket (it was: exit 141; see the program's comment).
#[test]
fn c_a_daemon_survives_abandoned_client_connections() {
    let exe = build_c(
        "capi/tests/c/client_socket_abuse.c",
        "c-test-client_socket_abuse",
    );
    run_program("client_socket_abuse", &exe, &[]);
}
