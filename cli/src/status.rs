//! `tbon status`: an operator's view of a live DVM, gathered in the tree (`tbon::status`).
//! Connects to one daemon (rank 0 for the whole DVM) as a tool with the operator credential,
//! never as a daemon.
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tbon::Key;
use tbon::oob::uri::ContactUri;
use tbon::status::view::{RankState, View, view};
use tbon::status::{DaemonStatus, Part, Report, StatusOptions, problem};

/// Arguments of `tbon status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub contact: ContactArgs,
    /// How long the daemons may take to answer; a subtree silent for longer is shown as
    /// "no answer".
    #[arg(long, default_value_t = tbon::limits::STATUS_BUDGET_MS_DEFAULT)]
    pub budget_ms: u32,
    /// Every daemon in detail (by default healthy subtrees are summarised).
    #[arg(long)]
    pub all: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Ask again every SECONDS until interrupted (a view that fails is reported on stderr and
    /// the watch goes on; the exit code is the last view's).
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<f64>,
    /// With --watch: stop after this many views.
    #[arg(long, requires = "watch")]
    pub count: Option<u64>,
}

/// Which daemon a tool asks, and the credential it proves (`tbon status`, `tbon clock`).
#[derive(Debug, Args)]
pub struct ContactArgs {
    /// The contact URI of the daemon to ask (rank 0's for the whole DVM).
    #[arg(long, env = "TBON_HNP")]
    pub hnp: Option<String>,
    /// Read the contact URI from this file (rank 0's `--uri-file`).
    #[arg(long)]
    pub hnp_file: Option<PathBuf>,
    /// The operator credential (`tbon keygen --operator`); without it, the job key from
    /// --key-file, TBON_KEY_FILE or TBON_KEY is used to derive it.
    #[arg(long)]
    pub credential_file: Option<PathBuf>,
    /// The DVM's job key file (the credential is derived from it).
    #[arg(long, env = "TBON_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// How long to wait for the connection and its handshake (a stopped daemon fails after
    /// this); the answer then has the budget plus this.
    #[arg(long, default_value_t = 5_000)]
    pub connect_timeout_ms: u64,
}

impl ContactArgs {
    /// The options of a query with this budget.
    pub fn options(&self, budget_ms: u32, all: bool) -> Result<StatusOptions, String> {
        if budget_ms == 0 || budget_ms > tbon::limits::STATUS_BUDGET_MS_MAX {
            return Err(format!(
                "--budget-ms must be 1 to {}, not {budget_ms}",
                tbon::limits::STATUS_BUDGET_MS_MAX
            ));
        }
        if self.connect_timeout_ms == 0 {
            return Err("--connect-timeout-ms must be at least 1".into());
        }
        Ok(StatusOptions {
            budget_ms,
            all,
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
        })
    }
}

/// How `tbon status` renders a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The tree, indented, one daemon per line (healthy subtrees folded).
    Text,
    /// One JSON object per view: the report, every rank's state, a summary.
    Json,
    /// A Graphviz digraph: dead daemons red, silent ones orange, unknown ones grey.
    Dot,
}

/// Runs `tbon status`: exit 0 when every daemon answered and none is dead, 1 when some are
/// dead or silent, an error (exit 2) when no view could be had.
pub fn run(args: StatusArgs) -> Result<i32, String> {
    let contact = contact(&args.contact)?;
    let credential = credential(&args.contact)?;
    let options = args.contact.options(args.budget_ms, args.all)?;
    let interval = match args.watch {
        Some(s) if !(s > 0.0 && s.is_finite()) => {
            return Err(format!(
                "--watch must be a positive number of seconds, not {s}"
            ));
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if interval.is_some() {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, interrupted.clone()).map_err(|e| e.to_string())?;
        }
    }
    let mut shown = 0u64;
    loop {
        let started = std::time::Instant::now();
        let report = match tbon::status::query(&contact, &credential, &options) {
            Ok(r) => r,
            Err(e) => {
                let why = format!(
                    "{}: {e}",
                    contact
                        .addrs
                        .first()
                        .map_or_else(String::new, |a| a.to_string())
                );
                // Watching goes on through a failed view (the DVM may be restarting); a
                // single view's failure is the command's.
                let Some(every) = interval else {
                    return Err(why);
                };
                eprintln!("tbon status: {why}");
                shown += 1;
                if args.count.is_some_and(|c| shown >= c) {
                    return Ok(2);
                }
                let until = started + every;
                while std::time::Instant::now() < until {
                    if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok(2);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
        };
        let took = started.elapsed();
        let v = view(&report).map_err(|e| format!("the report does not fit a tree: {e}"))?;
        let out = match args.format {
            Format::Text => text(&report, &v, took),
            Format::Json => json(&report, &v, took)?,
            Format::Dot => dot(&report, &v),
        };
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(format!("writing: {e}")),
            Ok(()) => {}
        }
        shown += 1;
        let healthy = v.healthy();
        let Some(every) = interval else {
            return Ok(if healthy { 0 } else { 1 });
        };
        if args.count.is_some_and(|c| shown >= c) {
            return Ok(if healthy { 0 } else { 1 });
        }
        let until = started + every;
        while std::time::Instant::now() < until {
            if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(if healthy { 0 } else { 1 });
            }
            std::thread::sleep(
                Duration::from_millis(50)
                    .min(until.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }
}

/// The daemon to ask, from `--hnp`, `--hnp-file` or `TBON_HNP`.
pub fn contact(args: &ContactArgs) -> Result<ContactUri, String> {
    let text = match (&args.hnp, &args.hnp_file) {
        (Some(uri), None) => uri.clone(),
        (None, Some(path)) => {
            let t = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            t.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .ok_or_else(|| format!("{} holds no contact URI", path.display()))?
                .to_string()
        }
        (Some(_), Some(_)) => return Err("give --hnp or --hnp-file, not both".into()),
        (None, None) => {
            return Err("give the daemon's contact: --hnp URI, --hnp-file FILE or TBON_HNP".into());
        }
    };
    text.parse::<ContactUri>().map_err(|e| e.to_string())
}

/// The operator credential: `--credential-file`, or derived from the job key.
pub fn credential(args: &ContactArgs) -> Result<Key, String> {
    if let Some(path) = &args.credential_file {
        return Key::from_file(path).map_err(|e| format!("--credential-file: {e}"));
    }
    if let Some(path) = &args.key_file {
        return Key::from_file(path)
            .map(|k| k.operator())
            .map_err(|e| e.to_string());
    }
    match std::env::var("TBON_KEY") {
        Ok(k) => Key::from_bytes(k)
            .map(|k| k.operator())
            .map_err(|e| format!("TBON_KEY: {e}")),
        Err(_) => Err(
            "no credential: give --credential-file (the operator credential), or the job key \
             with --key-file, TBON_KEY_FILE or TBON_KEY"
                .into(),
        ),
    }
}

fn detail(report: &Report, rank: u32) -> Option<&DaemonStatus> {
    report.parts.iter().find_map(|p| match p {
        Part::Daemon(d) if d.rank == rank => Some(&**d),
        _ => None,
    })
}

fn healthy_root(report: &Report, rank: u32) -> Option<&tbon::status::Healthy> {
    report.parts.iter().find_map(|p| match p {
        Part::Healthy(h) if h.root == rank => Some(h),
        _ => None,
    })
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn uptime(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s / 60) % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn list(ranks: &[u32]) -> String {
    const SHOWN: usize = 32;
    let mut s: Vec<String> = ranks.iter().take(SHOWN).map(u32::to_string).collect();
    if ranks.len() > SHOWN {
        s.push(format!("... ({} more)", ranks.len() - SHOWN));
    }
    s.join(", ")
}

fn text(report: &Report, v: &View, took: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "DVM of {} daemon{}, radix {}, epoch {}; gathered by rank {} in {} ({} at the tool)",
        report.size,
        if report.size == 1 { "" } else { "s" },
        report.radix,
        report.epoch,
        report.from,
        ms(report.elapsed_us),
        ms(took.as_micros() as u64),
    );
    let answered = v.count(RankState::Alive) + v.count(RankState::Healthy);
    let _ = writeln!(
        out,
        "answered {answered}, dead {}, no answer {}, unknown {}{}{}{}",
        v.count(RankState::Dead),
        v.count(RankState::NoAnswer),
        v.count(RankState::Unknown),
        match v.count(RankState::Unreached) {
            0 => String::new(),
            n => format!(", unreached {n}"),
        },
        match v.count(RankState::Departed) {
            0 => String::new(),
            n => format!(", departed {n}"),
        },
        match v.count(RankState::Absent) {
            0 => String::new(),
            n => format!(", absent {n}"),
        }
    );
    for (state, what) in [
        (RankState::Dead, "dead"),
        (RankState::NoAnswer, "no answer (suspected)"),
        (RankState::Unknown, "unknown (below a silent daemon)"),
        (RankState::Unreached, "unreached"),
        (RankState::Departed, "departed (left in order)"),
        (RankState::Absent, "absent (room to grow, not joined)"),
    ] {
        let r = v.ranks_in(state);
        if !r.is_empty() {
            let _ = writeln!(out, "{what}: {}", list(&r));
        }
    }
    if report.truncated {
        let _ = writeln!(out, "(some detail was dropped to keep the answer bounded)");
    }
    if v.views_differ {
        let _ = writeln!(out, "(a repair was under way: the daemons' views differed)");
    }
    // The tree, depth first from the gathering daemon.
    let by_rank = |r: u32| {
        v.ranks
            .binary_search_by_key(&r, |x| x.rank)
            .ok()
            .and_then(|i| v.ranks.get(i))
    };
    let base = by_rank(report.from).map_or(0, |r| r.depth);
    let mut stack = vec![report.from];
    while let Some(r) = stack.pop() {
        let Some(rv) = by_rank(r) else { continue };
        let indent = "  ".repeat(rv.depth.saturating_sub(base) as usize);
        if let Some(h) = healthy_root(report, r) {
            let _ = writeln!(
                out,
                "{indent}{r}  healthy subtree: {} daemon{}, height {}, uptime >= {}{}, sent {}, delivered {}, relayed {}",
                h.daemons,
                if h.daemons == 1 { "" } else { "s" },
                h.height,
                uptime(h.uptime_ms_min),
                h.rtt_us_max
                    .map_or_else(String::new, |u| format!(", rtt max {u} us")),
                h.counters.sent,
                h.counters.delivered,
                h.counters.relayed,
            );
            continue;
        }
        match rv.state {
            RankState::NoAnswer => {
                let below = count_below(v, r);
                let _ = writeln!(
                    out,
                    "{indent}{r}  NO ANSWER within the budget{}",
                    if below > 0 {
                        format!(" ({below} below it unknown)")
                    } else {
                        String::new()
                    }
                );
                continue;
            }
            RankState::Unreached => {
                let _ = writeln!(out, "{indent}{r}  unreached");
            }
            _ => {}
        }
        if let Some(d) = detail(report, r) {
            let rtts: Vec<String> = d
                .links
                .iter()
                .filter_map(|l| l.rtt_us.map(|u| format!("{}:{u}us", l.peer)))
                .collect();
            let queued: Vec<String> = d
                .links
                .iter()
                .filter(|l| l.queued_bytes > 0)
                .map(|l| format!("{}:{}B", l.peer, l.queued_bytes))
                .collect();
            // Which network each link uses, and its failovers, where a link failed over.
            let failed_over: Vec<String> = d
                .links
                .iter()
                .filter(|l| l.failovers > 0)
                .map(|l| {
                    let via = l
                        .address
                        .map_or_else(|| "-".to_string(), |a| a.ip().to_string());
                    format!("{} via {via} after {} failovers", l.peer, l.failovers)
                })
                .collect();

            let mut queued_text = if queued.is_empty() {
                String::new()
            } else {
                format!(", queued {}", queued.join(" "))
            };
            if !failed_over.is_empty() {
                queued_text.push_str(&format!(", links {}", failed_over.join("; ")));
            }
            let problems = problem::names(d.problems);
            let c = &d.counters;
            let _ = writeln!(
                out,
                "{indent}{r}  up {}, inc {}, epoch {}, failed {}{}{}{}  sent {} delivered {} relayed {}{}{}{}",
                uptime(d.uptime_ms),
                d.incarnation,
                d.epoch,
                d.failed_known,
                if rtts.is_empty() {
                    String::new()
                } else {
                    format!(", rtt {}", rtts.join(" "))
                },
                queued_text,
                if problems.is_empty() {
                    String::new()
                } else {
                    format!("  [{}]", problems.join(", "))
                },
                c.sent,
                c.delivered,
                c.relayed,
                if c.relm_unacked + c.relm_cached + c.relm_pending > 0 {
                    format!(
                        ", relm unacked {} cached {} pending {}",
                        c.relm_unacked, c.relm_cached, c.relm_pending
                    )
                } else {
                    String::new()
                },
                if c.streams_producing + c.streams_consuming > 0 {
                    format!(
                        ", streams {} out {} in",
                        c.streams_producing, c.streams_consuming
                    )
                } else {
                    String::new()
                },
                if c.direct_links > 0 {
                    format!(", direct links {}", c.direct_links)
                } else {
                    String::new()
                },
            );
        }
        stack.extend(rv.children.iter().rev());
    }
    out
}

fn count_below(v: &View, r: u32) -> usize {
    v.ranks
        .iter()
        .filter(|x| x.state == RankState::Unknown)
        .filter(|x| {
            // Below r: walk x's parents up.
            let mut p = x.parent;
            let mut hops = 0;
            while let Some(q) = p {
                if q == r {
                    return true;
                }
                hops += 1;
                if hops > 64 {
                    break;
                }
                p = v
                    .ranks
                    .binary_search_by_key(&q, |y| y.rank)
                    .ok()
                    .and_then(|i| v.ranks.get(i))
                    .and_then(|y| y.parent);
            }
            false
        })
        .count()
}

#[derive(Serialize)]
struct JsonView<'a> {
    took_us: u64,
    #[serde(flatten)]
    view: tbon::status::view::Json<'a>,
}

fn json(report: &Report, v: &View, took: Duration) -> Result<String, String> {
    let j = JsonView {
        took_us: took.as_micros() as u64,
        view: tbon::status::view::Json::new(report, v),
    };
    let mut s = serde_json::to_string(&j).map_err(|e| e.to_string())?;
    s.push('\n');
    Ok(s)
}

fn dot(report: &Report, v: &View) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph dvm {{");
    let _ = writeln!(
        out,
        "  label=\"DVM of {} daemons, epoch {}\";\n  node [shape=circle, style=filled, fillcolor=white];",
        report.size, report.epoch
    );
    for r in &v.ranks {
        let colour = match r.state {
            RankState::Alive | RankState::Healthy => "palegreen",
            RankState::Dead => "red",
            RankState::Departed | RankState::Absent => "white",
            RankState::NoAnswer => "orange",
            _ => "lightgrey",
        };
        let _ = writeln!(
            out,
            "  {} [fillcolor={colour}, tooltip=\"{}\"];",
            r.rank,
            r.state.name()
        );
        if let Some(p) = r.parent {
            let _ = writeln!(out, "  {p} -> {};", r.rank);
        }
    }
    let _ = writeln!(out, "}}");
    out
}
