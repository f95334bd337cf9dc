//! Measures how many wake-up system calls the handle pays per command: a burst of sends from
//! one thread (the loop is busy, so almost none), then sends spaced out so the loop sleeps
//! between them (one each). Run: `cargo run --release --example wakeups`.

use std::time::Duration;
use tbon::config::Config;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = Config {
        if_include: vec!["127.0.0.1/32".into()],
        insecure: true, // one process, loopback only
        ..Config::default()
    };
    let d = tbon::start(cfg, 0, 1, None)?;
    d.wait_wired(Duration::from_secs(10));
    d.recv(tbon::Peer::Any, 100, tbon::RecvMode::Persistent, |_| {})?;
    let before = d.counters()?;
    let burst = 100_000;
    for i in 0..burst {
        d.send(0, 100, vec![i as u8])?;
    }
    let after_burst = d.counters()?;
    let spaced = 200;
    for i in 0..spaced {
        d.send(0, 100, vec![i as u8])?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let after_spaced = d.counters()?;
    let per = |a: &tbon::Counters, b: &tbon::Counters| {
        let cmds = b.commands - a.commands;
        let wakes = b.wakeups - a.wakeups;
        (cmds, wakes)
    };
    let (c1, w1) = per(&before, &after_burst);
    let (c2, w2) = per(&after_burst, &after_spaced);
    println!(
        "burst:  {c1} commands, {w1} wake-ups ({:.4} per command)",
        w1 as f64 / c1 as f64
    );
    println!(
        "spaced: {c2} commands, {w2} wake-ups ({:.4} per command)",
        w2 as f64 / c2 as f64
    );
    Ok(())
}
