//! `tbon tree` run as a user would.
use std::process::Command;

fn tbon(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tbon"))
        .args(args)
        .output()
        .expect("run tbon")
}

#[test]
fn json_output_for_the_orphan_case() {
    let out = tbon(&[
        "tree", "--size", "7", "--radix", "2", "--failed", "1,5", "--format", "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = serde_json::json!({
        "size": 7, "radix": 2, "failed": [1, 5],
        "ranks": [
            {"rank": 0, "parent": null, "children": [2, 3], "depth": 0},
            {"rank": 2, "parent": 0, "children": [4, 6], "depth": 1},
            {"rank": 3, "parent": 0, "children": [], "depth": 1},
            {"rank": 4, "parent": 2, "children": [], "depth": 2},
            {"rank": 6, "parent": 2, "children": [], "depth": 2},
        ]
    });
    assert_eq!(got, want);
}

#[test]
fn text_and_dot_output() {
    let out = tbon(&["tree", "--size", "7", "--radix", "2", "--failed", "5,1"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("failed: 1, 5"), "{text}");
    assert!(text.contains("3 (promoted into slot 1)"), "{text}");
    let out = tbon(&[
        "tree", "--size", "7", "--radix", "2", "--failed", "1", "--format", "dot",
    ]);
    assert!(out.status.success());
    let dot = String::from_utf8(out.stdout).unwrap();
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(dot.contains("1 [style=dashed"), "{dot}");
}

/// `tbon daemon --radix 1` builds the radix-2 tree (as PRRTE does); `tbon tree` shows that
/// tree, and says why, rather than refusing what the daemons take.
#[test]
fn a_radix_below_2_is_the_daemons_radix_2() {
    let out = tbon(&["tree", "--size", "7", "--radix", "1"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("size 7, radix 2 (--radix 1 is taken as 2"),
        "{text}"
    );
    let two = tbon(&["tree", "--size", "7", "--radix", "2"]);
    let two = String::from_utf8(two.stdout).unwrap();
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        two.lines().skip(1).collect::<Vec<_>>()
    );
    let out = tbon(&["tree", "--size", "7", "--radix", "0", "--format", "json"]);
    let json = String::from_utf8(out.stdout).unwrap();
    assert!(json.contains("\"radix\":2"), "{json}");
}

#[test]
fn bad_input_exits_non_zero_with_one_line() {
    for (args, needle) in [
        (vec!["--size", "0", "--radix", "2"], "--size"),
        (
            vec!["--size", "7", "--radix", "2", "--failed", "7"],
            "out of range",
        ),
        (
            vec!["--size", "7", "--radix", "2", "--failed", "0"],
            "rank 0",
        ),
        (
            vec!["--size", "7", "--radix", "2", "--failed", "1,x"],
            "\"x\"",
        ),
    ] {
        let mut full = vec!["tree"];
        full.extend(args.iter().copied());
        let out = tbon(&full);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
    // Values clap cannot parse are refused by clap, also with a non-zero code.
    let out = tbon(&["tree", "--size", "seven"]);
    assert!(!out.status.success());
}
