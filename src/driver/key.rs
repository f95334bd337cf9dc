//! Where a daemon's job key comes from: `Config::key`, else the file named by `key_file`, else
//! nothing — which is refused unless `insecure` is set. The `TBON_KEY` environment variable is
//! read only by [`Config::from_env`](crate::config::Config::from_env) (into `Config::key`) and
//! by the `tbon` command, never behind the caller's back. The key is never a command-line flag:
//! any user on the host can read command lines.

use crate::Rank;
use crate::config::Config;
use crate::error::StartError;
use crate::limits;
use crate::oob::handshake::JobKey;

/// A DVM's job key: every daemon of the DVM holds the same one, and a peer that cannot prove
/// it cannot join, inject or be adopted. Its format is its text: the bytes of a key file
/// (trailing line ends, LF or CR, dropped) are the key, never decoded, 16 to 4,096 bytes
/// (the one description: docs/security.md, "The job key: format and handling");
/// [`Key::generate`] makes 64 random hex characters. Give it to a daemon in
/// [`Config::key`](crate::config::Config::key), or write it to a file (owner-only) with
/// [`Key::write_new`] and name that in `key_file`. Its `Debug` form never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(Vec<u8>);

/// The environment variable that may hold the job key itself.
pub const ENV_VAR: &str = "TBON_KEY";

/// Why a key could not be made, read or written.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read, or created (it may exist already: never replaced).
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The key has `bytes` bytes, outside `limits::JOB_KEY_MIN_BYTES..=JOB_KEY_MAX_BYTES`.
    Length { bytes: usize },
    /// The system's random source failed.
    Random(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Io { path, source } => write!(f, "key file {}: {source}", path.display()),
            KeyError::Length { bytes } => write!(
                f,
                "a job key has {bytes} bytes; {} to {} are allowed",
                limits::JOB_KEY_MIN_BYTES,
                limits::JOB_KEY_MAX_BYTES
            ),
            KeyError::Random(e) => write!(f, "no random bytes for a key: {e}"),
        }
    }
}

impl std::error::Error for KeyError {}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key(<{} bytes, not shown>)", self.0.len())
    }
}

impl Key {
    /// A fresh random key: 64 hex characters (256 random bits).
    pub fn generate() -> Result<Key, KeyError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Key(raw
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            .into_bytes()))
    }

    /// The key made of `bytes`, less any trailing line ends (LF or CR, from `echo` or an
    /// editor: they are not part of a key).
    ///
    /// # Errors
    /// [`KeyError::Length`] when what is left is not 16 to 4,096 bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        let mut bytes = bytes.into();
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        if !(limits::JOB_KEY_MIN_BYTES..=limits::JOB_KEY_MAX_BYTES).contains(&bytes.len()) {
            return Err(KeyError::Length { bytes: bytes.len() });
        }
        Ok(Key(bytes))
    }

    /// The key in the file at `path`, as `key_file` reads it (and warns, as a daemon does, if
    /// other users may read the file).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Key, KeyError> {
        let path = path.as_ref();
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            // Its size is the directory's, not a key's: say what it is.
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a key file",
            )));
        }
        let len = meta.len();
        if len > limits::JOB_KEY_MAX_BYTES as u64 + 2 {
            return Err(KeyError::Length {
                bytes: usize::try_from(len).unwrap_or(usize::MAX),
            });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        warn_if_readable_by_others(&path.display().to_string());
        Key::from_bytes(bytes)
    }

    /// Writes the key and a newline to a new file at `path`, readable by its owner only. Fails
    /// (`Io`) if the file exists, so a running DVM's key is never overwritten by accident.
    pub fn write_new(&self, path: impl AsRef<std::path::Path>) -> Result<(), KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref();
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        f.write_all(&self.0).map_err(io)?;
        f.write_all(b"\n").map_err(io)
    }

    /// The key in the `TBON_KEY` environment variable (the key itself, not a path), `None`
    /// when it is unset or empty. [`Config::from_env`](crate::config::Config::from_env) calls
    /// this when no `key_file` is given; nothing else in the library reads `TBON_KEY`.
    ///
    /// # Errors
    /// [`KeyError::Length`] for a key shorter than 16 or longer than 4,096 bytes.
    pub fn from_env() -> Result<Option<Key>, KeyError> {
        Self::from_variable(std::env::var_os(ENV_VAR))
    }

    /// [`Key::from_env`] given the variable's value.
    pub(crate) fn from_variable(
        value: Option<std::ffi::OsString>,
    ) -> Result<Option<Key>, KeyError> {
        match value {
            Some(v) if !v.is_empty() => Key::from_bytes(v.into_encoded_bytes()).map(Some),
            _ => Ok(None),
        }
    }

    /// The key's bytes (handle with care: whoever holds them can join the DVM).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The read-only operator credential derived from this job key (64 hex characters of an
    /// HMAC-SHA256 of it): give it to operators instead of the job key. With it a tool can ask
    /// daemons for their status ([`crate::status::query`], `tbon status`); it cannot join the
    /// DVM, send to a daemon or be turned back into the job key. Write it with
    /// [`Key::write_new`] (`tbon keygen --operator`).
    pub fn operator(&self) -> Key {
        Key(JobKey::new(self.0.clone()).operator().bytes().to_vec())
    }
}

/// Loads the key: [`Config::key`](crate::config::Config::key), else the file named by
/// `key_file`. Reads no environment variable. Errors: an unreadable or badly sized key, or no
/// key without `insecure`.
pub(crate) fn load(cfg: &Config, rank: Rank) -> Result<JobKey, StartError> {
    let (key, source) = if let Some(k) = &cfg.key {
        (k.clone(), "Config::key".to_string())
    } else if let Some(path) = &cfg.key_file {
        let k = Key::from_file(path).map_err(StartError::Key)?;
        (k, format!("key file {path}"))
    } else if cfg.insecure {
        log::warn!(
            "rank {rank}: running UNAUTHENTICATED (insecure=true, no key): anyone who can reach \
             this daemon's port can join the DVM and inject messages"
        );
        return Ok(JobKey::none());
    } else {
        return Err(StartError::NoKey);
    };
    log::debug!("rank {rank}: job key from {source}");
    Ok(JobKey::new(key.0))
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
/// Fails if the file exists, so an existing DVM's key is never overwritten by accident
/// ([`Key::generate`] then [`Key::write_new`]).
pub fn generate(path: &std::path::Path) -> std::io::Result<()> {
    Key::generate()
        .and_then(|k| k.write_new(path))
        .map_err(|e| match e {
            KeyError::Io { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_round_trips_through_its_file_and_never_shows() {
        let k = Key::generate().unwrap();
        assert_eq!(k.as_bytes().len(), 64);
        assert!(k.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(k, Key::generate().unwrap());
        let text = String::from_utf8(k.as_bytes().to_vec()).unwrap();
        assert!(!format!("{k:?}").contains(&text), "Debug shows no key");
        let dir = std::env::temp_dir().join(format!("tbon-key-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job.key");
        k.write_new(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            Key::from_file(&path).unwrap(),
            k,
            "the newline is not part of it"
        );
        assert!(
            matches!(k.write_new(&path), Err(KeyError::Io { .. })),
            "never replaced"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_given_as_the_key_file_is_named_as_one() {
        let e = Key::from_file(std::env::temp_dir())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory"), "{e}");
    }

    #[test]
    fn a_key_is_its_text_within_the_bounds() {
        assert_eq!(
            Key::from_bytes("0123456789abcdef\r\n").unwrap().as_bytes(),
            b"0123456789abcdef"
        );
        assert!(matches!(
            Key::from_bytes("short"),
            Err(KeyError::Length { bytes: 5 })
        ));
        assert!(Key::from_bytes(vec![b'k'; limits::JOB_KEY_MAX_BYTES + 1]).is_err());
        assert!(matches!(
            Key::from_file("/nonexistent/tbon.key"),
            Err(KeyError::Io { .. })
        ));
    }
}
