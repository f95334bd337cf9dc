//! The `tbon` command line: see `tbon --help`.
use clap::{Parser, Subcommand};

mod bench;
mod client;
mod client_workload;
mod clock;
mod daemon;
mod group_workload;
mod harness;
mod report;
mod settings;
mod sim;
mod status;
mod stream_workload;
mod sweep;
mod tree;
mod workload;

#[derive(Parser)]
#[command(
    name = "tbon",
    version,
    about = "A fault-tolerant tree-based overlay network for HPC daemons"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the repaired routing tree for a size, radix and set of failed ranks.
    Tree(tree::TreeArgs),
    /// Run one daemon of a DVM until SIGTERM or a DVM shutdown.
    ///
    /// Signals: SIGTERM or SIGINT to rank 0 stops the whole DVM; to another rank, only that
    /// daemon (the others see a fault and repair around it). SIGUSR1 makes a rank other than 0
    /// leave the DVM in order (it exits 0 once every other daemon knows).
    ///
    /// Exit codes: 0 after a requested stop, a DVM shutdown or a leave; 1 after a fatal stop
    /// (rank 0 lost, this daemon declared dead by the DVM, left out of wire-up, rank 0
    /// unreachable at start-up, also with a wrong job key; a refused rejoin); 2 for a start-up
    /// error (bad flags or settings, no rank, no URI, no usable address, no job key, a bad key
    /// file), with the reason on stderr.
    Daemon(Box<daemon::DaemonArgs>),
    /// Write a fresh random job key to FILE (mode 0600; refuses to overwrite). Give every
    /// daemon of the DVM the same file with --key-file. With --operator KEYFILE, write instead
    /// the read-only operator credential derived from that job key (for `tbon status`).
    Keygen {
        /// Where to write the key.
        file: std::path::PathBuf,
        /// Derive the operator credential from this job key file.
        #[arg(long, value_name = "KEYFILE")]
        operator: Option<std::path::PathBuf>,
    },
    /// Show a live DVM: which daemons are alive, dead or silent, and where (gathered in the
    /// tree; connects as an operator's tool, never as a daemon).
    ///
    /// Exit codes: 0 when every daemon in the tree answered and none is dead (departed and
    /// absent ranks are no fault), 1 otherwise, 2 when no status could be had (unreachable,
    /// credential refused: the message says which).
    Status(Box<status::StatusArgs>),
    /// Measure every daemon's wall-clock offset from rank 0 (or the daemon asked), with an
    /// error bound, along the tree (as an operator's tool, like `tbon status`).
    Clock(Box<clock::ClockArgs>),
    /// Start a DVM of daemons on this machine, drive traffic through it, kill daemons in the
    /// middle, and check what was delivered.
    Harness(Box<harness::HarnessArgs>),
    /// Measure message rate, bandwidth, round trip and scale beside a raw-TCP baseline.
    Bench(Box<bench::BenchArgs>),
    /// Run the deterministic fault simulator over many seeds, or replay one.
    Sim(sim::SimArgs),
    /// A client process: connect to a daemon's client socket (`--client-socket`) with a job's
    /// credential, print the name it got, send or receive messages.
    ///
    /// Exit codes: 0 when done; 1 when `recv` ended short of its count (timed out, or the
    /// client's daemon went away); 2 for any other error (refused credential or flags, a send
    /// that failed: no such client, a client that exited, a reserved tag; the message says
    /// which).
    Client(client::ClientArgs),
    /// One client process of `tbon harness --clients-per-daemon` (started by its daemon).
    #[command(hide = true)]
    ClientWorker(client_workload::WorkerArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let (name, result) = match Cli::parse().command {
        Command::Tree(tree) => ("tree", tree::run(&tree).map(|()| 0)),
        Command::Daemon(args) => ("daemon", daemon::run(*args)),
        Command::Keygen {
            file,
            operator: None,
        } => (
            "keygen",
            tbon::driver::key::generate(&file)
                .map(|()| 0)
                .map_err(|e| format!("{}: {e}", file.display())),
        ),
        Command::Keygen {
            file,
            operator: Some(job),
        } => (
            "keygen",
            tbon::Key::from_file(&job)
                .and_then(|k| k.operator().write_new(&file))
                .map(|()| 0)
                .map_err(|e| e.to_string()),
        ),
        Command::Status(args) => ("status", status::run(*args)),
        Command::Clock(args) => ("clock", clock::run(*args)),
        Command::Harness(args) => ("harness", harness::run(*args)),
        Command::Bench(args) => ("bench", bench::run(*args)),
        Command::Sim(args) => ("sim", sim::run(args)),
        Command::Client(args) => ("client", client::run(args)),
        Command::ClientWorker(args) => ("client-worker", client_workload::worker(args)),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(message) => {
            eprintln!("tbon {name}: {message}");
            std::process::exit(2);
        }
    }
}
