//! `tbon tree`: show the repaired routing tree for a size, radix and failed set.
use std::fmt::Write as _;
use std::io::Write as _;

use clap::{Args, ValueEnum};
use serde::Serialize;
use tbon::Rank;
use tbon::routed::{NodeView, TreeError, tree_view};

/// Arguments of `tbon tree`.
#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Number of daemons (ranks 0..SIZE).
    #[arg(long)]
    pub size: u32,
    /// Radix of the tree. Below 2 it is taken as 2, as `tbon daemon` (and PRRTE) does.
    #[arg(long, default_value_t = 64)]
    pub radix: u32,
    /// Failed ranks, comma separated (rank 0 cannot fail).
    #[arg(long, value_name = "R1,R2,...")]
    pub failed: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// How `tbon tree` renders the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// An indented tree.
    Text,
    /// One JSON object: size, radix, failed ranks and one entry per living rank.
    Json,
    /// A Graphviz digraph.
    Dot,
}

#[derive(Serialize)]
struct JsonTree<'a> {
    size: u32,
    radix: u32,
    failed: &'a [Rank],
    ranks: Vec<JsonRank<'a>>,
}

#[derive(Serialize)]
struct JsonRank<'a> {
    rank: Rank,
    parent: Option<Rank>,
    children: &'a [Rank],
    depth: u32,
}

/// Render the tree to stdout; the error is a one-line message naming the bad input.
pub fn run(args: &TreeArgs) -> Result<(), String> {
    let failed = parse_failed(args.failed.as_deref().unwrap_or(""))?;
    // The daemons' own rule (`Config::effective_radix`): the tree shown is the one they build.
    let radix = args.radix.max(2);
    let view = tree_view(radix, args.size, &failed).map_err(|e| describe(&e, args))?;
    let out = match args.format {
        Format::Text => text(args, &failed, &view),
        Format::Json => json(args, &failed, &view)?,
        Format::Dot => dot(&failed, &view),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out.as_bytes()) {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing: {e}")),
        _ => Ok(()),
    }
}

/// Parse `1,5,9` into ascending, deduplicated ranks.
fn parse_failed(list: &str) -> Result<Vec<Rank>, String> {
    let mut ranks = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let rank = item
            .parse::<Rank>()
            .map_err(|_| format!("--failed: {item:?} is not a rank"))?;
        ranks.push(rank);
    }
    ranks.sort_unstable();
    ranks.dedup();
    Ok(ranks)
}

fn describe(error: &TreeError, args: &TreeArgs) -> String {
    match error {
        // Not reached: `run` takes a radix below 2 as 2.
        TreeError::RadixTooSmall => format!("--radix must be at least 2 (got {})", args.radix),
        TreeError::EmptyTree => "--size must be at least 1".to_string(),
        TreeError::RankOutOfRange { rank, size } => {
            format!("--failed: rank {rank} is out of range (ranks run 0..{size})")
        }
        TreeError::RootFailed => "--failed: rank 0 is the root and cannot fail".to_string(),
        TreeError::ShrinkNotAllowed => error.to_string(),
    }
}

fn list(ranks: &[Rank]) -> String {
    let items: Vec<String> = ranks.iter().map(Rank::to_string).collect();
    items.join(", ")
}

fn text(args: &TreeArgs, failed: &[Rank], view: &[NodeView]) -> String {
    let mut out = String::new();
    let radix = args.radix.max(2);
    if radix == args.radix {
        let _ = writeln!(out, "size {}, radix {radix}", args.size);
    } else {
        let _ = writeln!(
            out,
            "size {}, radix {radix} (--radix {} is taken as {radix}, as tbon daemon does)",
            args.size, args.radix
        );
    }
    if failed.is_empty() {
        let _ = writeln!(out, "failed: none");
    } else {
        let _ = writeln!(out, "failed: {}", list(failed));
    }
    let index = |rank: Rank| view.binary_search_by_key(&rank, |n| n.rank).ok();
    // Depth-first from rank 0, children ascending; depth is bounded by 33 layers.
    let mut stack: Vec<Rank> = vec![0];
    while let Some(rank) = stack.pop() {
        let Some(node) = index(rank).and_then(|i| view.get(i)) else {
            continue;
        };
        let indent = "  ".repeat(usize::try_from(node.depth).unwrap_or(0));
        if node.slot == node.rank {
            let _ = writeln!(out, "{indent}{rank}");
        } else {
            let _ = writeln!(out, "{indent}{rank} (promoted into slot {})", node.slot);
        }
        stack.extend(node.children.iter().rev());
    }
    out
}

fn json(args: &TreeArgs, failed: &[Rank], view: &[NodeView]) -> Result<String, String> {
    let tree = JsonTree {
        size: args.size,
        radix: args.radix.max(2),
        failed,
        ranks: view
            .iter()
            .map(|n| JsonRank {
                rank: n.rank,
                parent: n.parent,
                children: &n.children,
                depth: n.depth,
            })
            .collect(),
    };
    let mut out = serde_json::to_string(&tree).map_err(|e| format!("encoding JSON: {e}"))?;
    out.push('\n');
    Ok(out)
}

fn dot(failed: &[Rank], view: &[NodeView]) -> String {
    let mut out = String::from("digraph tbon {\n  node [shape=circle];\n");
    for node in view {
        if node.slot == node.rank {
            let _ = writeln!(out, "  {};", node.rank);
        } else {
            let _ = writeln!(
                out,
                "  {} [label=\"{}\\nslot {}\", style=filled, fillcolor=gold];",
                node.rank, node.rank, node.slot
            );
        }
    }
    for rank in failed {
        let _ = writeln!(out, "  {rank} [style=dashed, color=gray, fontcolor=gray];");
    }
    for node in view {
        for child in &node.children {
            let _ = writeln!(out, "  {} -> {child};", node.rank);
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_failed_lists() {
        assert_eq!(parse_failed("5, 1,5,").unwrap(), [1, 5]);
        assert_eq!(parse_failed("").unwrap(), Vec::<Rank>::new());
        assert!(parse_failed("1,x").unwrap_err().contains("\"x\""));
        assert!(parse_failed("-1").is_err());
    }

    #[test]
    fn text_marks_promotions() {
        let args = TreeArgs {
            size: 7,
            radix: 2,
            failed: None,
            format: Format::Text,
        };
        let view = tree_view(2, 7, &[1, 5]).unwrap();
        let out = text(&args, &[1, 5], &view);
        assert_eq!(
            out,
            "size 7, radix 2\nfailed: 1, 5\n0\n  2\n    4\n    6\n  3 (promoted into slot 1)\n"
        );
        let graph = dot(&[1, 5], &view);
        assert!(graph.contains("1 [style=dashed"));
        assert!(graph.contains("0 -> 3;"));
    }
}
