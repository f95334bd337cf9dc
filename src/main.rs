//! The `tbon` command line: see `tbon --help`.
use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(name = "tbon", version, about = "A fault-tolerant tree-based overlay network for HPC daemons")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one daemon of a DVM until SIGTERM or a DVM shutdown.
    Daemon(Box<cli::daemon::DaemonArgs>),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let result = match Cli::parse().command {
        Command::Daemon(args) => cli::daemon::run(*args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("tbon: {e}");
            std::process::exit(2);
        }
    }
}
