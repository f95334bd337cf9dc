//! `tbon client`: a client process from the shell (issue "Jobs"): connect to a daemon's
//! client socket with a job's credential, print the name it got, send or receive messages.
//! The credential comes from the environment a launcher sets (`TBON_CLIENT_SOCKET`,
//! `TBON_CLIENT_JOB`, `TBON_CLIENT_KEY`) or from flags.

use std::path::PathBuf;
use std::time::Duration;

use tbon::{Client, ClientName};

#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The daemon's client socket (default: TBON_CLIENT_SOCKET).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The job (default: TBON_CLIENT_JOB).
    #[arg(long)]
    job: Option<u64>,
    /// A file with the job's client key, 64 hexadecimal digits (default: TBON_CLIENT_KEY).
    #[arg(long)]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Connect, print this client's name (RANK.LOCAL) and leave.
    Name,
    /// Send TEXT to client TO (RANK.LOCAL) with TAG, COUNT times, waiting for each result.
    Send {
        to: ClientName,
        tag: u32,
        text: String,
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
    /// Print this client's name, then COUNT messages as they arrive ("FROM TAG TEXT").
    Recv {
        #[arg(long)]
        from: Option<ClientName>,
        #[arg(long)]
        tag: Option<u32>,
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Give up (exit 1) when a message takes longer than this.
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: u64,
    },
}

pub fn run(args: ClientArgs) -> Result<i32, String> {
    let client = connect(&args)?;
    match args.what {
        What::Name => println!("{}", client.name()),
        What::Send {
            to,
            tag,
            text,
            count,
        } => {
            for _ in 0..count {
                client
                    .send_wait(
                        to,
                        tag,
                        text.clone().into_bytes(),
                        Some(Duration::from_secs(60)),
                    )
                    .map_err(|e| format!("send to {to}: {e}"))?;
            }
            println!("{} sent {count} to {to}", client.name());
        }
        What::Recv {
            from,
            tag,
            count,
            timeout_ms,
        } => {
            use std::io::Write;
            println!("{}", client.name());
            let _ = std::io::stdout().flush();
            for _ in 0..count {
                match client.recv(from, tag, Some(Duration::from_millis(timeout_ms))) {
                    Ok(m) => {
                        println!(
                            "{} {} {}",
                            m.from,
                            m.tag,
                            String::from_utf8_lossy(&m.payload)
                        );
                        let _ = std::io::stdout().flush();
                    }
                    Err(e) => {
                        eprintln!("tbon client: {e}");
                        return Ok(1);
                    }
                }
            }
        }
    }
    Ok(0)
}

fn connect(args: &ClientArgs) -> Result<Client, String> {
    if args.socket.is_none() && args.job.is_none() && args.key_file.is_none() {
        return Client::from_env().map_err(|e| e.to_string());
    }
    let env = |n: &str| {
        std::env::var(n).map_err(|_| {
            format!(
                "give --{} or set {n}",
                n.trim_start_matches("TBON_CLIENT_").to_ascii_lowercase()
            )
        })
    };
    let socket = match &args.socket {
        Some(s) => s.clone(),
        None => PathBuf::from(env(tbon::clients::ENV_SOCKET)?),
    };
    let job = match args.job {
        Some(j) => j,
        None => env(tbon::clients::ENV_JOB)?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", tbon::clients::ENV_JOB))?,
    };
    let key_text = match &args.key_file {
        Some(f) => std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?,
        None => env(tbon::clients::ENV_KEY)?,
    };
    let key = tbon::clients::parse_key(&key_text)?;
    Client::connect(&socket, job, &key).map_err(|e| e.to_string())
}
