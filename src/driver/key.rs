//! Where a daemon's job key comes from: the file named by `key_file`, else the `TBON_KEY`
//! environment variable, else nothing — which is refused unless `insecure` is set. The key is
//! never a command-line flag: any user on the host can read command lines.

use crate::Rank;
use crate::config::Config;
use crate::error::StartError;
use crate::limits;
use crate::oob::handshake::JobKey;

/// Loads the key. Errors: an unreadable or too short key, or no key without `insecure`.
pub(crate) fn load(cfg: &Config, rank: Rank) -> Result<JobKey, StartError> {
    let (bytes, source) = if let Some(path) = &cfg.key_file {
        let len = std::fs::metadata(path)
            .map_err(|e| StartError::Config(format!("cannot read key_file {path}: {e}")))?
            .len();
        if len > limits::JOB_KEY_MAX_BYTES as u64 + 2 {
            return Err(StartError::Config(format!(
                "key_file {path} has {len} bytes; at most {} are allowed",
                limits::JOB_KEY_MAX_BYTES
            )));
        }
        let b = std::fs::read(path)
            .map_err(|e| StartError::Config(format!("cannot read key_file {path}: {e}")))?;
        warn_if_readable_by_others(path);
        (b, format!("key file {path}"))
    } else if let Some(v) = std::env::var_os("TBON_KEY") {
        (v.into_encoded_bytes(), "TBON_KEY".to_string())
    } else if cfg.insecure {
        log::warn!(
            "rank {rank}: running UNAUTHENTICATED (insecure=true, no key): anyone who can reach \
             this daemon's port can join the DVM and inject messages"
        );
        return Ok(JobKey::none());
    } else {
        return Err(StartError::Config(
            "no job key: set key_file (TBON_KEY_FILE) or TBON_KEY, or set insecure=true to run \
             unauthenticated (`tbon keygen FILE` makes a key)"
                .into(),
        ));
    };
    // A trailing newline from `echo` or an editor is not part of the key.
    let mut bytes = bytes;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.len() < limits::JOB_KEY_MIN_BYTES {
        return Err(StartError::Config(format!(
            "the job key from {source} has {} bytes; at least {} are required",
            bytes.len(),
            limits::JOB_KEY_MIN_BYTES
        )));
    }
    if bytes.len() > limits::JOB_KEY_MAX_BYTES {
        return Err(StartError::Config(format!(
            "the job key from {source} has {} bytes; at most {} are allowed",
            bytes.len(),
            limits::JOB_KEY_MAX_BYTES
        )));
    }
    log::debug!("rank {rank}: job key from {source}");
    Ok(JobKey::new(bytes))
}

fn warn_if_readable_by_others(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        log::warn!("key file {path} is readable by other users; chmod 600 it");
    }
}

/// Writes a fresh random key (64 hex characters) to `path`, readable by its owner only.
/// Fails if the file exists, so an existing DVM's key is never overwritten by accident.
pub fn generate(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| std::io::Error::other(e.to_string()))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{hex}")
}
