//! A consumer fetches a file-sized object from a producer with a stream (README "Streams").
//!
//! Three daemons in this process on loopback (radix 2: ranks 1 and 2 are one relay apart).
//! Rank 1 serves "file": the request is a path, the answer its bytes from the request's
//! offset. Rank 2 fetches a 64 MiB file through rank 0 into another file and compares them.
//!
//! Run: `cargo run --release --example fetch_file`

use std::io::Write;
use std::time::{Duration, Instant};
use tbon::config::Config;
use tbon::{StreamRequest, StreamWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tbon-fetch-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("job.key");
    tbon::Key::generate()?.write_new(&key)?;
    let cfg = Config {
        radix: 2,
        if_include: vec!["127.0.0.1/32".into()],
        key_file: Some(key.display().to_string()),
        ..Config::default()
    };
    let root = tbon::start(cfg.clone(), 0, 3, None)?;
    let uri = root.contact_uri().to_string();
    let producer = tbon::start(cfg.clone(), 1, 3, Some(&uri))?;
    let consumer = tbon::start(cfg, 2, 3, Some(&uri))?;
    for d in [&root, &producer, &consumer] {
        if !d.wait_wired(Duration::from_secs(30)) {
            return Err("the DVM did not wire up".into());
        }
    }

    // The object: 64 MiB of a pattern.
    let source = dir.join("source.bin");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&source)?);
    for i in 0..(64u64 << 20) / 8 {
        f.write_all(&(i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes())?;
    }
    f.flush()?;
    drop(f);

    producer.serve("file", |req: StreamRequest, mut w: StreamWriter| {
        let path = String::from_utf8_lossy(&req.request).into_owned();
        let Ok(data) = std::fs::read(&path) else {
            let _ = w.fail(2, "no such file");
            return;
        };
        let data = bytes::Bytes::from(data);
        // A stream that resumed after its path broke asks for the rest only.
        let start = (req.offset as usize).min(data.len());
        if w.write(data.slice(start..)).is_ok() {
            let _ = w.finish();
        }
    })?;

    let copy = dir.join("copy.bin");
    let t = Instant::now();
    let mut s = consumer.fetch(1, "file", source.display().to_string())?;
    let mut out = std::fs::File::create(&copy)?;
    let n = std::io::copy(&mut s.reader(), &mut out)?;
    let secs = t.elapsed().as_secs_f64();
    if std::fs::read(&source)? != std::fs::read(&copy)? {
        return Err("the copy differs from the source".into());
    }
    // A path the producer cannot read: its own failure, with its code, not a hang.
    let mut missing = consumer.fetch(1, "file", "/nonexistent/ckpt")?;
    match missing.next() {
        Some(Err(tbon::StreamError::Producer { code: 2, .. })) => {}
        other => return Err(format!("a missing file ended {other:?}").into()),
    }
    println!(
        "fetched {n} bytes in {secs:.2} s ({:.0} MiB/s), identical; a missing file failed with the producer's code",
        n as f64 / secs / f64::from(1u32 << 20)
    );
    root.shutdown_dvm();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
