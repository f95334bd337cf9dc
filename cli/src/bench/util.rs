//! Helpers shared by the bench roles: rendezvous files, clocks, statistics.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub type Res<T> = Result<T, String>;

/// Maps any error to a message with context.
pub fn ctx<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Nanoseconds since the Unix epoch (comparable across processes on one machine).
pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Writes `text` to `path` through a temporary file and a rename, so readers never see half.
pub fn write_atomically(path: &Path, text: &str) -> Res<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(ctx("write rendezvous file"))?;
    std::fs::rename(&tmp, path).map_err(ctx("rename rendezvous file"))
}

/// Waits up to `timeout` for `path` to exist and returns its contents.
pub fn wait_file(path: &Path, timeout: Duration) -> Res<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return Ok(s.trim().to_string());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {}", path.display()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The `q`-quantile (0..=1) of `samples` (sorted in place), in microseconds.
pub fn quantile_us(samples: &mut [Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_unstable();
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples
        .get(i.min(samples.len() - 1))
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Counts received messages and remembers when the first and the last arrived.
pub struct RateMeter {
    pub want: u64,
    pub got: u64,
    pub bytes: u64,
    first: Option<Instant>,
}

impl RateMeter {
    pub fn new(want: u64) -> Self {
        RateMeter {
            want,
            got: 0,
            bytes: 0,
            first: None,
        }
    }

    /// Records one message; returns the JSON report once the last one arrived. The clock is
    /// read only at the first and the last message: a clock read per message cost the
    /// receivers (tbon and raw alike) about 15% of a 64 B stream.
    pub fn on_message(&mut self, len: usize) -> Option<String> {
        if self.first.is_none() {
            self.first = Some(Instant::now());
        } else {
            // The first message starts the clock; it is not counted in the rate.
            self.bytes += len as u64;
        }
        self.got += 1;
        if self.got != self.want {
            return None;
        }
        let now = Instant::now();
        let secs = self
            .first
            .map_or(0.0, |f| now.duration_since(f).as_secs_f64());
        Some(
            serde_json::json!({
                "msgs": self.got.saturating_sub(1),
                "bytes": self.bytes,
                "secs": secs,
            })
            .to_string(),
        )
    }
}

/// Resident memory of a process in KiB from /proc: (VmRSS, RssAnon). RssAnon leaves out the
/// mapped binary and libraries, i.e. it is the daemon's own heap and stacks.
pub fn vm_rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = s.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmRSS:")?, field("RssAnon:")?))
}
