//! The URI file: how rank 0 publishes its contact URI on a filesystem the other daemons see
//! ([`crate::launch::Rendezvous::File`], `tbon daemon --uri-file`/`--hnp-file`). The file holds
//! the URI on its first line and a stamp of this start on the next (so a reader can tell a
//! replaced file from the one it read); it is written atomically without following links,
//! refused in a directory anyone may write to, and removed when rank 0 stops unless another
//! rank 0 has replaced it since.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A URI file as rank 0 writes it: the contact URI on the first line, then a stamp with a
/// nonce drawn at this start (the URI alone can repeat across runs: a fixed port, the same
/// `--dvm-id`), so a reader can tell that the file was replaced by another rank 0.
pub(crate) fn uri_file_text(uri: &str) -> String {
    let nonce = getrandom::u64().unwrap_or_else(|_| {
        // No OS generator: the clock and the pid still differ from one start to the next.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id())
    });
    format!(
        "{uri}\n# tbon rank 0 start {nonce:016x}, pid {}\n",
        std::process::id()
    )
}

/// The contact URI in a URI file's text: its first non-empty line (a file with the URI alone,
/// written by hand or by an older tbon, is read too).
pub fn uri_of(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| !l.is_empty())
}

/// Rank 0 removes its URI file when it exits, unless another rank 0 has replaced it since: the
/// next launch then waits for a fresh file instead of reading this run's address.
#[derive(Debug)]
pub struct UriFile {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
}

impl Drop for UriFile {
    fn drop(&mut self) {
        if std::fs::read_to_string(&self.path).is_ok_and(|t| t == self.text) {
            match std::fs::remove_file(&self.path) {
                Ok(()) => log::debug!("removed {}", self.path.display()),
                Err(e) => log::warn!("cannot remove {}: {e}", self.path.display()),
            }
        }
    }
}

/// Reads a URI file, waiting up to `timeout` for it to appear; returns its whole text.
/// A file with no URI yet (being written by hand, say) is waited for too. A file owned by
/// another user than this process's (root excepted) is refused: in a shared directory such as
/// `/tmp` anyone may create the name first and point the daemons elsewhere (the job key keeps
/// an impostor out, but the DVM would not form).
pub fn read(path: &Path, timeout: Duration) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let deadline = Instant::now() + timeout;
    loop {
        // Whether the file is there without a URI in it, for the message at the deadline.
        let without_uri = match std::fs::read_to_string(path) {
            Ok(s) if uri_of(&s).is_some() => {
                let owner = std::fs::metadata(path).map(|m| m.uid()).unwrap_or(0);
                let me = nix::unistd::geteuid().as_raw();
                if owner != me && owner != 0 {
                    return Err(format!(
                        "{} is owned by uid {owner}, not by this user (uid {me}) or root: \
                         someone else may have planted it; keep URI files in a directory \
                         only the job's user can write",
                        path.display()
                    ));
                }
                return Ok(s);
            }
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        if Instant::now() >= deadline {
            let what = if without_uri {
                "held no contact URI"
            } else {
                "did not appear"
            };
            return Err(format!(
                "{} {what} within {} ms (the wire-up timeout, `wireup_timeout_ms`)",
                path.display(),
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `text` to `path` so that a reader sees the whole file or none, and nobody else on
/// the host can redirect the write: the temporary file has a name of its own, is created
/// exclusively (never through a link planted at that name) in the same directory, and is then
/// renamed over `path` (which replaces a link at `path`, never writes through it). A directory
/// that others may write to without the sticky bit is refused: anyone could swap the file
/// after it is written and point the other daemons at their own address.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mode = std::fs::metadata(&dir)?.permissions().mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by every user and not sticky: anyone could replace the URI file",
                dir.display()
            ),
        ));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "uri".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::write_atomically;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tbon-uri-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A link planted at the URI file's path (or at the old fixed temporary name) is replaced,
    /// never written through.
    #[test]
    fn a_planted_link_is_replaced_not_followed() {
        let d = dir("link");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let uri = d.join("hnp.uri");
        std::os::unix::fs::symlink(&victim, &uri).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("hnp.tmp")).unwrap();
        write_atomically(&uri, "tbon.0;tcp://127.0.0.1:1").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(&uri).unwrap(),
            "tbon.0;tcp://127.0.0.1:1"
        );
        assert!(!std::fs::symlink_metadata(&uri).unwrap().is_symlink());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A directory every user may write to, without the sticky bit, is refused.
    #[test]
    fn an_empty_file_is_told_apart_from_a_missing_one() {
        let dir = std::env::temp_dir().join(format!("tbon-uri-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (empty, missing) = (dir.join("empty.uri"), dir.join("missing.uri"));
        std::fs::write(&empty, "").unwrap();
        let short = std::time::Duration::from_millis(60);
        let e = super::read(&empty, short).unwrap_err();
        assert!(e.contains("held no contact URI"), "{e}");
        let e = super::read(&missing, short).unwrap_err();
        assert!(e.contains("did not appear"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_world_writable_directory_is_refused() {
        let d = dir("open");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = write_atomically(&d.join("hnp.uri"), "x").unwrap_err();
        assert!(err.to_string().contains("writable by every user"), "{err}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        write_atomically(&d.join("hnp.uri"), "x").unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }
}
