//! `tbon bench` roles start, talk and report: a quick ping-pong run (tbon and the plain mio
//! baseline, several processes). Checks only that the table is printed; never timing.
use std::process::Command;

#[test]
fn bench_pingpong_prints_its_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(["bench", "--quick", "--only", "pingpong"])
        .output()
        .expect("run tbon bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tbon bench failed: {text}");
    assert!(text.contains("| tbon |"), "{text}");
    assert!(text.contains("| plain mio, same wake-ups |"), "{text}");
}
