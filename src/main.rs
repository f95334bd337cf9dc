//! The `tbon` command line: see `tbon --help`.
use clap::{Parser, Subcommand};

mod cli;

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
    Tree(cli::tree::TreeArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Cli::parse();
    let (name, result) = match &args.command {
        Command::Tree(tree) => ("tree", cli::tree::run(tree)),
    };
    if let Err(message) = result {
        eprintln!("tbon {name}: {message}");
        std::process::exit(2);
    }
}
