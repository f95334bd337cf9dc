//! A tiny resource manager in Rust that starts a DVM of daemons as separate processes.
//!
//! Run it: `cargo run --release --example resource_manager -- 4` (4 daemons; needs a job key:
//! `tbon keygen /tmp/job.key` and `TBON_KEY_FILE=/tmp/job.key`).
//!
//! The program is both the launcher and the daemon. As the launcher it starts itself N times,
//! each child with `TBON_RANK` and `TBON_SIZE` set as srun or mpirun would, and tells them where
//! rank 0 will publish its contact URI (`TBON_HNP_FILE`, a file in a private directory). As a
//! daemon it forms the DVM with `tbon::launch`, greets the next rank around a ring, waits for
//! the previous rank's greeting, meets the others in a barrier, then runs two jobs on
//! overlapping sets of daemons (the lower half and one more, the upper half and one more), each
//! with its own data exchange: every member puts its endpoint, commits, fences (job 1 in full
//! mode, job 2 in direct mode), reads every other member's endpoint and gathers the members'
//! core counts in a group allgather. Each member daemon also starts the job's application
//! process on its node: a client (`tbon::Client`) that connects to its daemon's socket with the
//! job's credential; the daemons publish their client's name through the job's data exchange
//! (as PMIx publishes endpoints), hand each client its neighbours' names, and the clients greet
//! each other around the job's ring through the daemons. Then it stops: rank 0 shuts the whole
//! DVM down, the others check that this is why they stopped. The launcher checks every child's
//! exit status and that rank 0 removed its URI file, then prints "resource_manager: ok".

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;
use tbon::launch::{Placement, Rendezvous, launch};
use tbon::{FenceMode, Group, Handle, Peer, Rank, StopReason};

/// The tag of the ring greeting (user tags start at 100).
const TAG_HELLO: u32 = 100;
/// A guard against hangs, not a performance figure.
const TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    // An application process: its daemon gave it a job's client credential.
    if std::env::var_os(tbon::clients::ENV_JOB).is_some() {
        return match client() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("resource_manager: a client: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A daemon: the launcher gave it a rank.
    if std::env::var_os("TBON_RANK").is_some() {
        return match daemon() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "resource_manager: rank {:?}: {e}",
                    std::env::var("TBON_RANK")
                );
                ExitCode::FAILURE
            }
        };
    }
    match launcher() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("resource_manager: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Starts N copies of this program as daemons and checks how they ended.
fn launcher() -> Res<()> {
    let n: u32 = std::env::args().nth(1).map_or(Ok(4), |a| a.parse())?;
    if std::env::var_os("TBON_KEY_FILE").is_none() {
        return Err("set TBON_KEY_FILE to a job key file (tbon keygen FILE)".into());
    }
    // A directory only this user can write: nobody else can plant the URI file.
    let dir = std::env::temp_dir().join(format!("tbon-rm-{}", std::process::id()));
    std::fs::create_dir(&dir)?;
    let uri_file = dir.join("hnp.uri");
    let me = std::env::current_exe()?;
    // Every rank at once, as a launcher does: the others wait for rank 0's file.
    let mut children = Vec::new();
    for rank in 0..n {
        let child = Command::new(&me)
            .env("TBON_RANK", rank.to_string())
            .env("TBON_SIZE", n.to_string())
            .env("TBON_HNP_FILE", &uri_file)
            .spawn()?;
        children.push((rank, child));
    }
    let mut failed = Vec::new();
    for (rank, mut child) in children {
        if !child.wait()?.success() {
            failed.push(rank);
        }
    }
    let left = uri_file.exists();
    let _ = std::fs::remove_dir_all(&dir);
    if !failed.is_empty() {
        return Err(format!("ranks {failed:?} failed").into());
    }
    if left {
        return Err("rank 0 left its URI file behind".into());
    }
    println!("resource_manager: ok ({n} daemons as processes)");
    Ok(())
}

/// One daemon: form the DVM, greet the ring, barrier, stop.
fn daemon() -> Res<()> {
    let at = Placement::from_env()?;
    let how = Rendezvous::from_env()?.ok_or("no rendezvous in the environment")?;
    let mut config = tbon::config::Config::from_env()?; // the key from TBON_KEY_FILE
    config.if_include = vec!["127.0.0.1/32".into()]; // this example stays on one host
    // The socket the job's processes on this node connect to, beside the URI file.
    let dir = std::path::PathBuf::from(std::env::var("TBON_HNP_FILE")?);
    let sock = dir.with_file_name(format!("clients-{}.sock", at.rank));
    config.client_socket = Some(sock.display().to_string());
    let d = launch(config, at, &how)?;
    if !d.wait_wired(TIMEOUT) {
        return Err("not wired".into());
    }
    let (rank, size) = (at.rank, at.size);
    let next = (rank + 1) % size;
    let previous = (rank + size - 1) % size;
    d.send(next, TAG_HELLO, format!("hello from {rank}"))?;
    let m = d.recv_blocking(Peer::Rank(previous), TAG_HELLO, TIMEOUT)?;
    if m.payload != format!("hello from {previous}").as_bytes() {
        return Err(format!("a wrong greeting: {:?}", m.payload).into());
    }
    d.barrier_wait(1, TIMEOUT)?;
    // Two jobs on overlapping daemons: ranks 0..=size/2 and size/2..size.
    let half = size / 2;
    let jobs = [
        (1, (0..=half).collect::<Vec<Rank>>(), FenceMode::Full),
        (2, (half..size).collect::<Vec<Rank>>(), FenceMode::Direct),
    ];
    // A daemon in both jobs runs them one after the other (each job's members call its
    // collectives in the same order; different jobs need no order between them).
    for (context, members, mode) in jobs {
        if members.contains(&rank) {
            run_job(&d, rank, context, &members, mode)?;
        }
    }
    d.barrier_wait(2, TIMEOUT)?;
    if rank == 0 {
        d.shutdown_dvm();
        return Ok(());
    }
    match d.wait_stopped(TIMEOUT) {
        Some(StopReason::DvmShutdown) => Ok(()),
        other => Err(format!("stopped for {other:?}, not the DVM shutdown").into()),
    }
}

/// This daemon's part of job `context`: its endpoint into the data exchange, a fence, every
/// other member's endpoint read back, and a group allgather of core counts; the job's
/// application process on this node, whose name goes through the data exchange too.
fn run_job(d: &Handle, rank: Rank, context: u64, members: &[Rank], mode: FenceMode) -> Res<()> {
    let job = Group::new(context, members.iter().copied())?;
    let endpoint = |r: Rank| format!("job {context}: rank {r} listens on 127.0.0.1:{}", 7000 + r);
    // The job's process here: started with the job's credential; it prints its name.
    let cred = d.client_job(context, &[])?;
    let mut app = Command::new(std::env::current_exe()?)
        .env_remove("TBON_RANK")
        .envs(cred.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut from_app = BufReader::new(app.stdout.take().ok_or("no stdout")?).lines();
    let name = from_app.next().ok_or("the client said nothing")??;
    d.put(&job, "client", name)?;
    d.put(&job, "endpoint", endpoint(rank))?;
    d.commit(&job)?;
    let excluded = d.fence_wait(&job, mode, TIMEOUT)?;
    if !excluded.is_empty() {
        return Err(format!("job {context}: members {excluded:?} missed the fence").into());
    }
    for &m in members {
        let got = d.get_wait(&job, m, "endpoint", TIMEOUT)?;
        if got != endpoint(m).as_bytes() {
            return Err(format!("job {context}: rank {m}'s endpoint is wrong: {got:?}").into());
        }
    }
    // Each client greets the next member's client around the job's ring.
    let at = members
        .iter()
        .position(|m| *m == rank)
        .ok_or("not a member")?;
    let next = members[(at + 1) % members.len()];
    let previous = members[(at + members.len() - 1) % members.len()];
    let name_of = |r: Rank| -> Res<String> {
        Ok(String::from_utf8(
            d.get_wait(&job, r, "client", TIMEOUT)?.to_vec(),
        )?)
    };
    let mut to_app = app.stdin.take().ok_or("no stdin")?;
    writeln!(to_app, "{} {}", name_of(next)?, name_of(previous)?)?;
    drop(to_app);
    if !app.wait()?.success() {
        return Err(format!("job {context}: the application process on rank {rank} failed").into());
    }
    let cores = d.group_allgather_wait(&job, vec![rank as u8 + 1], TIMEOUT)?;
    let ranks: Vec<Rank> = cores.ranks().collect();
    if ranks != members {
        return Err(format!("job {context}: the allgather has {ranks:?}").into());
    }
    d.forget_group(&job)?;
    Ok(())
}

/// An application process of a job: connect to this node's daemon with the credential the
/// daemon gave us, say our name, learn our neighbours' names, greet the next one, and wait
/// for the previous one's greeting.
fn client() -> Res<()> {
    let c = tbon::Client::from_env()?;
    println!("{}", c.name());
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let mut names = line.split_whitespace().map(str::parse::<tbon::ClientName>);
    let (Some(next), Some(previous)) = (names.next(), names.next()) else {
        return Err("no neighbours given".into());
    };
    let (next, previous) = (next?, previous?);
    c.send_wait(
        next,
        TAG_HELLO,
        format!("hello from {}", c.name()),
        Some(TIMEOUT),
    )?;
    let m = c.recv(Some(previous), Some(TAG_HELLO), Some(TIMEOUT))?;
    if m.payload != format!("hello from {previous}").as_bytes() {
        return Err(format!("a wrong greeting: {:?}", m.payload).into());
    }
    Ok(())
}
