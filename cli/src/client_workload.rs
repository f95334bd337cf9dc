//! The harness's client traffic (`tbon harness --clients-per-daemon C`, issue "Jobs"): each
//! daemon opens job 1 for clients and starts C `tbon client-worker` processes with the job's
//! credential in their environment, as a resource manager starts a job's processes. The
//! workers connect, wait for the daemons' start barrier, watch every other worker, send
//! numbered messages round-robin to every other worker, end each stream with a `DONE`
//! marker, and leave once every peer has said `DONE` or is reported gone. Each writes what
//! it sent and received to `client-RANK.LOCAL.json` in the run's folder, which
//! `harness/check_clients.rs` judges.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tbon::{Client, ClientError, ClientName, Handle};

/// The job every worker belongs to.
pub const CLIENT_JOB: u64 = 1;
/// Tags of the workers' numbered messages and of their end marker.
const TAG_DATA: u32 = 500;
const TAG_DONE: u32 = 501;
/// Collective id of the daemons' start barrier (the workload's own ids are far below).
const START_BARRIER_ID: u64 = 0xc11e_0000;
/// How long a worker waits for its peers' ends before giving up (a guard against hangs).
const WORKER_GUARD: Duration = Duration::from_secs(240);

/// The daemon's side: starts the workers and waits for them.
pub struct ClientRunner {
    pub h: Handle,
    pub rank: u32,
    pub size: u32,
    pub per_daemon: u32,
    pub messages: u64,
    pub rate: f64,
    pub seed: u64,
    pub dir: PathBuf,
    pub done: Arc<AtomicBool>,
}

impl ClientRunner {
    pub fn run(self) {
        if let Err(e) = self.run_inner() {
            log::error!("rank {}: client workload: {e}", self.rank);
        }
        self.done.store(true, Ordering::SeqCst);
    }

    fn run_inner(&self) -> Result<(), String> {
        let cred = self
            .h
            .client_job(CLIENT_JOB, &[])
            .map_err(|e| format!("opening the client job: {e}"))?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let go = go_file(&self.dir, self.rank);
        let mut children: Vec<Child> = Vec::new();
        for _ in 0..self.per_daemon {
            let child = Command::new(&exe)
                .arg("client-worker")
                .args(["--size", &self.size.to_string()])
                .args(["--per-daemon", &self.per_daemon.to_string()])
                .args(["--messages", &self.messages.to_string()])
                .args(["--rate", &self.rate.to_string()])
                .args(["--seed", &self.seed.to_string()])
                .arg("--dir")
                .arg(&self.dir)
                .arg("--go")
                .arg(&go)
                .envs(cred.env())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("starting a client: {e}"))?;
            children.push(child);
        }
        // Every worker admitted here (its pid file), then every daemon's: then traffic.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let admitted = (1..=self.per_daemon)
                .filter(|l| {
                    pid_file(
                        &self.dir,
                        ClientName {
                            rank: self.rank,
                            local: *l,
                        },
                    )
                    .exists()
                })
                .count();
            if admitted == self.per_daemon as usize {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(e) = self
            .h
            .barrier_wait(START_BARRIER_ID, Duration::from_secs(120))
        {
            log::warn!("rank {}: client start barrier: {e}", self.rank);
        }
        std::fs::write(&go, b"go").map_err(|e| format!("{}: {e}", go.display()))?;
        for mut c in children {
            let _ = c.wait();
        }
        Ok(())
    }
}

/// Where worker `name` writes its pid once admitted.
pub fn pid_file(dir: &Path, name: ClientName) -> PathBuf {
    dir.join(format!("client-{name}.pid"))
}

/// Where worker `name` writes its results.
pub fn result_file(dir: &Path, name: ClientName) -> PathBuf {
    dir.join(format!("client-{name}.json"))
}

fn go_file(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("clients-go-{rank}"))
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    size: u32,
    #[arg(long)]
    per_daemon: u32,
    #[arg(long)]
    messages: u64,
    #[arg(long)]
    rate: f64,
    #[arg(long)]
    seed: u64,
    #[arg(long)]
    dir: PathBuf,
    /// Appears once the daemons' start barrier is over.
    #[arg(long)]
    go: PathBuf,
}

/// What one worker saw of one peer.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct PeerRecord {
    /// Sends to it that ended `Ok`, and that ended with an error (by error).
    pub sent_ok: u64,
    pub send_errors: BTreeMap<String, u64>,
    /// Messages from it: how many, and those out of sequence (a gap, a duplicate or a
    /// reordering), or with a wrong checksum.
    pub received: u64,
    pub out_of_order: u64,
    pub corrupt: u64,
    /// Its `DONE` marker arrived (after all its messages), and with how many it counted.
    pub done_with: Option<u64>,
    /// What the watch reported.
    pub exit: Option<String>,
}

/// One worker's results file.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct WorkerRecord {
    pub name: String,
    pub daemon_lost: Option<String>,
    pub timed_out: bool,
    pub peers: BTreeMap<String, PeerRecord>,
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

fn data(from: ClientName, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(56);
    v.extend_from_slice(&from.rank.to_le_bytes());
    v.extend_from_slice(&from.local.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend(std::iter::repeat_n((seq % 251) as u8, 32));
    let c = checksum(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

fn error_kind(e: &ClientError) -> String {
    let s = format!("{e:?}");
    s.split(['(', ' ', '{'])
        .next()
        .unwrap_or("other")
        .to_string()
}

/// `tbon client-worker`: one client process of the harness (started by its daemon).
pub fn worker(args: WorkerArgs) -> Result<i32, String> {
    let client = Client::from_env().map_err(|e| e.to_string())?;
    let me = client.name();
    std::fs::write(pid_file(&args.dir, me), std::process::id().to_string())
        .map_err(|e| e.to_string())?;
    let record = Arc::new(Mutex::new(WorkerRecord {
        name: me.to_string(),
        ..Default::default()
    }));
    let peers: Vec<ClientName> = (0..args.size)
        .flat_map(|rank| (1..=args.per_daemon).map(move |local| ClientName { rank, local }))
        .filter(|n| *n != me)
        .collect();
    {
        let mut r = record.lock().unwrap_or_else(|p| p.into_inner());
        for p in &peers {
            r.peers.insert(p.to_string(), PeerRecord::default());
        }
    }
    // Receive: order checked per sender; the marker says how many came before it.
    let expect: Arc<Mutex<BTreeMap<ClientName, u64>>> = Arc::default();
    {
        let (rec, expect) = (record.clone(), expect.clone());
        client
            .recv_cb(None, None, true, move |m| {
                let mut r = rec.lock().unwrap_or_else(|p| p.into_inner());
                let Some(p) = r.peers.get_mut(&m.from.to_string()) else {
                    return;
                };
                if m.tag == TAG_DONE {
                    let n = m
                        .payload
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes);
                    p.done_with = Some(n.unwrap_or(u64::MAX));
                    return;
                }
                p.received += 1;
                let ok = m.payload.len() == 56
                    && checksum(&m.payload[..48]).to_le_bytes() == m.payload[48..56];
                if !ok {
                    p.corrupt += 1;
                    return;
                }
                let seq = u64::from_le_bytes(m.payload[8..16].try_into().unwrap_or([0; 8]));
                let mut e = expect.lock().unwrap_or_else(|p| p.into_inner());
                let next = e.entry(m.from).or_insert(0);
                if seq != *next {
                    p.out_of_order += 1;
                }
                *next = seq + 1;
            })
            .map_err(|e| e.to_string())?;
    }
    // Wait for the start (every worker of the DVM admitted), then watch every peer.
    let start_guard = Instant::now() + Duration::from_secs(180);
    while !args.go.exists() && Instant::now() < start_guard && client.daemon_lost().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in &peers {
        let rec = record.clone();
        let _ = client.watch(*p, move |n, why| {
            let mut r = rec.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = r.peers.get_mut(&n.to_string()) {
                p.exit = Some(format!("{why:?}"));
            }
        });
    }
    // Send: numbered messages round-robin, at the rate asked.
    let mut seq: BTreeMap<ClientName, u64> = BTreeMap::new();
    let start = Instant::now();
    let rate = args.rate.max(1.0);
    for i in 0..args.messages {
        if client.daemon_lost().is_some() {
            break;
        }
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let to = peers[(i as usize + me.local as usize) % peers.len().max(1)];
        let s = seq.entry(to).or_insert(0);
        let payload = data(me, *s);
        *s += 1;
        let rec = record.clone();
        let sent = client.send(to, TAG_DATA, payload, move |r| {
            let mut rec = rec.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = rec.peers.get_mut(&to.to_string()) {
                match r {
                    Ok(()) => p.sent_ok += 1,
                    Err(e) => *p.send_errors.entry(error_kind(&e)).or_default() += 1,
                }
            }
        });
        if sent.is_err() {
            break;
        }
    }
    // Every send answered, then the markers.
    let deadline = Instant::now() + WORKER_GUARD;
    while client.in_flight() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in &peers {
        let n = seq.get(p).copied().unwrap_or(0);
        let _ = client.send(*p, TAG_DONE, n.to_le_bytes().to_vec(), |_| {});
    }
    // Leave once every peer said DONE or is gone (or this worker's daemon is).
    let mut timed_out = true;
    while Instant::now() < deadline {
        let settled = {
            let r = record.lock().unwrap_or_else(|p| p.into_inner());
            r.peers
                .values()
                .all(|p| p.done_with.is_some() || p.exit.is_some())
        };
        if settled || client.daemon_lost().is_some() {
            timed_out = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The markers' completions, so no peer sees this worker leave before its marker.
    let end = Instant::now() + Duration::from_secs(10);
    while client.in_flight() > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let daemon_lost = client.daemon_lost();
    drop(client);
    // Gone from here on: the harness must not signal this pid (it may be reused).
    let _ = std::fs::remove_file(pid_file(&args.dir, me));
    let mut r = record.lock().unwrap_or_else(|p| p.into_inner());
    r.daemon_lost = daemon_lost;
    r.timed_out = timed_out;
    let text = serde_json::to_string(&*r).map_err(|e| e.to_string())?;
    std::fs::write(result_file(&args.dir, me), text).map_err(|e| e.to_string())?;
    Ok(0)
}

/// Reads every worker's results file in `dir`.
pub fn read_all(dir: &Path) -> BTreeMap<ClientName, WorkerRecord> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("client-")
            .and_then(|s| s.strip_suffix(".json"))
        else {
            continue;
        };
        let (Ok(n), Ok(text)) = (n.parse::<ClientName>(), std::fs::read_to_string(e.path())) else {
            continue;
        };
        if let Ok(r) = serde_json::from_str(&text) {
            out.insert(n, r);
        }
    }
    out
}
