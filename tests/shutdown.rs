//! Shutdown leaves no thread and no socket behind. Its own test binary: it counts the
//! process's threads and file descriptors, which other tests running in parallel would disturb.

mod common;

use common::{loopback_config, start_dvm};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn shutdown_leaves_no_threads_or_sockets() {
    let threads_before = count("/proc/self/task");
    let fds_before = count("/proc/self/fd");
    for round in 0..3 {
        let dvm = start_dvm(8, &loopback_config(2));
        for d in &dvm {
            for dst in 0..8 {
                if dst != d.rank() {
                    d.send(dst, 100, "x").unwrap();
                }
            }
        }
        assert!(
            count("/proc/self/task") >= threads_before + 8,
            "round {round}"
        );
        drop(dvm);
        assert_eq!(
            count("/proc/self/task"),
            threads_before,
            "threads left (round {round})"
        );
        assert_eq!(
            count("/proc/self/fd"),
            fds_before,
            "descriptors left (round {round})"
        );
    }
}
