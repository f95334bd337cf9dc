//! Helpers shared by the integration tests: in-process DVMs on loopback.
#![allow(dead_code)]

pub mod wire;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;
use tbon::config::Config;
use tbon::{Daemon, Rank};

/// Generous: only a guard against hangs, never a performance assertion.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A job key file shared by this test binary's daemons.
pub fn key_file() -> &'static PathBuf {
    static KEY: OnceLock<PathBuf> = OnceLock::new();
    KEY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tbon-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job.key");
        std::fs::write(&path, "0123456789abcdef-test-key\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    })
}

/// A configuration that keeps every daemon on loopback, authenticated with the test key.
pub fn loopback_config(radix: u32) -> Config {
    Config {
        radix,
        if_include: vec!["127.0.0.1/32".to_string()],
        key_file: Some(key_file().display().to_string()),
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

/// A handshake nonce no other call in this test binary returns, for the scripted peers (the
/// handshake takes its nonce from the caller; daemons draw theirs from the OS).
pub fn nonce() -> [u8; tbon::oob::handshake::NONCE_LEN] {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut nonce = [0x5a; tbon::oob::handshake::NONCE_LEN];
    nonce[..8].copy_from_slice(&(u64::from(std::process::id()) << 32 | n).to_le_bytes());
    nonce
}
