//! Helpers shared by the integration tests: in-process DVMs on loopback.
#![allow(dead_code)]

use std::time::Duration;
use tbon::config::Config;
use tbon::{Daemon, Rank};

/// Generous: only a guard against hangs, never a performance assertion.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A configuration that keeps every daemon on loopback.
pub fn loopback_config(radix: u32) -> Config {
    Config {
        radix,
        if_include: vec!["127.0.0.1/32".to_string()],
        ..Config::default()
    }
}

/// Starts `size` daemons in this process (rank 0 first) and waits until all are wired.
pub fn start_dvm(size: u32, cfg: &Config) -> Vec<Daemon> {
    start_dvm_with(size, |_| cfg.clone())
}

/// Like [`start_dvm`], with a configuration per rank.
pub fn start_dvm_with(size: u32, cfg: impl Fn(Rank) -> Config) -> Vec<Daemon> {
    let _ = env_logger::builder().is_test(true).try_init();
    let root = tbon::start(cfg(0), 0, size, None).expect("start rank 0");
    let uri = root.contact_uri().to_string();
    let mut dvm = vec![root];
    for r in 1..size {
        dvm.push(tbon::start(cfg(r), r, size, Some(&uri)).expect("start daemon"));
    }
    for d in &dvm {
        assert!(
            d.wait_wired(HANG_GUARD),
            "rank {} did not wire up",
            d.rank()
        );
    }
    dvm
}
