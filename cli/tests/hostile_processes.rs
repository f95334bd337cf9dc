//! Strangers attacking a DVM of real `tbon daemon` processes while traffic flows, through
//! `tbon harness --attack`: forged Hellos claiming every rank (renewed faster than the handshake
//! timeout) while two interior daemons are killed, and a flood of 2,000 idle, partial,
//! Hello-only and slow connections. The harness's own checks must hold (every fault repaired,
//! no live daemon declared dead, nothing lost outside the fault windows, clean stops); the
//! memory figures it reports are measurements, not asserted. Timeouts are hang guards only.

mod procs;

#[test]
fn forged_hellos_for_every_rank_do_not_stop_repairs() {
    let (report, stdout) = procs::harness_report(
        "hostile-forge",
        &[
            "--daemons",
            "8",
            "--radix",
            "2",
            "--attack",
            "forge",
            "--kill",
            "2",
            "--kill-interior",
            "--duration",
            "6",
            "--timeout",
            "120",
        ],
    );
    assert_eq!(report["passed"], true, "{stdout}");
    assert_eq!(report["survivors"], 6, "{stdout}");
    let outcome = &report["attack"]["outcome"];
    assert!(outcome["forged_hellos"].as_u64().unwrap() > 0, "{stdout}");
}

#[test]
fn a_flood_of_2000_connections_is_survived() {
    let (report, stdout) = procs::harness_report(
        "hostile-flood",
        &[
            "--daemons",
            "8",
            "--radix",
            "2",
            "--attack",
            "flood",
            "--attack-connections",
            "2000",
            "--kill",
            "1",
            "--duration",
            "6",
            "--timeout",
            "120",
        ],
    );
    assert_eq!(report["passed"], true, "{stdout}");
    let outcome = &report["attack"]["outcome"];
    assert!(outcome["opened"].as_u64().unwrap() >= 2000, "{stdout}");
    assert_eq!(
        report["attack"]["rss_anon_kib"].as_array().unwrap().len(),
        8,
        "{stdout}"
    );
}

/// A lone rank 0 (of 2, never wired) as a `tbon daemon` process, run through `sh` with
/// `ulimit -n` when `fds` is given; killed on drop. Its handshake timeout is far beyond the
/// tests' hang guards, so only what the tests do closes a connection.
struct LoneRank0 {
    child: std::process::Child,
    dir: std::path::PathBuf,
    addr: std::net::SocketAddr,
    dvm_id: String,
}

impl LoneRank0 {
    fn start(name: &str, fds: Option<u32>) -> LoneRank0 {
        let dir = std::env::temp_dir().join(format!("tbon-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uri_file = dir.join("hnp.uri");
        let _ = std::fs::remove_file(&uri_file);
        let mut cmd = match fds {
            Some(n) => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_tbon"));
                c
            }
            None => std::process::Command::new(env!("CARGO_BIN_EXE_tbon")),
        };
        let child = cmd
            .args(["daemon", "--rank", "0", "--size", "2"])
            .arg("--key-file")
            .arg(procs::keygen_file())
            .args(["--if-include", "127.0.0.1/32"])
            .args(["--handshake-timeout-ms", "600000"])
            .arg("--uri-file")
            .arg(&uri_file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let guard = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(&uri_file)
                && !t.trim().is_empty()
            {
                break t;
            }
            assert!(std::time::Instant::now() < guard, "no URI file");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let uri: tbon::oob::uri::ContactUri = text.lines().next().unwrap().trim().parse().unwrap();
        LoneRank0 {
            child,
            dir,
            addr: uri.addrs[0],
            dvm_id: uri.dvm_id,
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// A connection from `source` (a loopback address of its own, so that the per-source
    /// bound is not what the test measures).
    fn connect_from(&self, source: &str) -> std::net::TcpStream {
        let source: std::net::SocketAddr = format!("{source}:0").parse().unwrap();
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&source.into()).unwrap();
        s.connect(&self.addr.into()).unwrap();
        let s = std::net::TcpStream::from(s);
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        s
    }

    /// A stranger's Hello claiming rank 1 (any key: a Hello carries no proof).
    fn hello(&self, s: &mut std::net::TcpStream, n: u8) {
        use std::io::Write;
        let cfg = tbon::oob::HandshakeConfig {
            me: 1,
            size: 2,
            epoch: 0,
            dvm_id: self.dvm_id.clone(),
            key: tbon::oob::handshake::JobKey::new(*b"not the job key, only a Hello"),
        };
        let mut hs = tbon::oob::Handshake::dial(&cfg, 0, [n; 16]);
        while let Some((h, p)) = hs.poll_transmit() {
            s.write_all(&h.encode()).unwrap();
            s.write_all(&p).unwrap();
        }
    }

    /// The daemon's answer on `s` must be a HelloAck.
    fn expect_hello_ack(s: &mut std::net::TcpStream, what: &str) {
        use std::io::Read;
        let mut head = [0u8; tbon::oob::HEADER_LEN];
        s.read_exact(&mut head)
            .unwrap_or_else(|e| panic!("{what} never answered: {e}"));
        let h = tbon::oob::Header::decode(&head).unwrap();
        assert_eq!(h.kind, tbon::oob::Kind::HelloAck);
    }
}

impl Drop for LoneRank0 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A burst of connections larger than one accept round (`ACCEPTS_PER_EVENT_MAX`) queued while
/// the daemon cannot run: every one is accepted and answered once it runs again. The listener
/// is edge-triggered; before the fix, what one round left in the backlog waited for the next
/// connection to arrive, so here (no next connection) it was never answered.
#[test]
fn a_burst_queued_while_the_daemon_is_stopped_is_all_answered() {
    let d = LoneRank0::start("burst", None);
    d.signal(nix::sys::signal::Signal::SIGSTOP);
    // 150 connections from three source addresses (50 each, under the per-source bound), each
    // with a Hello, all queued before the daemon runs again.
    let mut conns: Vec<_> = (0..150u8)
        .map(|i| {
            let mut s = d.connect_from(&format!("127.0.0.{}", 2 + i / 50));
            d.hello(&mut s, i);
            s
        })
        .collect();
    d.signal(nix::sys::signal::Signal::SIGCONT);
    for (i, s) in conns.iter_mut().enumerate() {
        LoneRank0::expect_hello_ack(s, &format!("connection {i} of 150"));
    }
}

/// A daemon out of file descriptors keeps its backlog and accepts it once descriptors are
/// free, without waiting for a new connection: before, `accept` failing (EMFILE) left the
/// edge-triggered listener idle until the next connection arrived, so the last connection of
/// a burst was never answered.
#[test]
fn a_daemon_out_of_descriptors_accepts_its_backlog_once_they_are_free() {
    // 40 descriptors: enough to start, few enough that the flood below exhausts them.
    let d = LoneRank0::start("emfile", Some(40));
    let flood: Vec<_> = (0..60u8)
        .map(|i| d.connect_from(&format!("127.0.0.{}", 2 + i / 30)))
        .collect();
    // One more, behind the flood in the backlog, that must be answered in the end.
    let mut last = d.connect_from("127.0.0.1");
    d.hello(&mut last, 99);
    // Give the daemon time to run out, then free its descriptors: the flood hangs up.
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(flood);
    LoneRank0::expect_hello_ack(&mut last, "the connection left in the backlog");
}
