//! The `tbon` command line: see `tbon --help`.
use clap::{Parser, Subcommand};

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
enum Command {}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match cli.command {}
}
