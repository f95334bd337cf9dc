//! The harness's judgement of pattern `stream` (issue "Streams"): every stream a survivor
//! fetched from a survivor must finish with every byte right (relays may die on its path: it
//! resumes); a stream whose producer was a victim may instead fail with the documented
//! errors, `producer-died` (or `node-down` when the fetch found it dead, `timed-out` when a
//! stopped producer went silent). Streams fetched by a victim are not judged: it wrote no
//! results.

use std::collections::{BTreeMap, BTreeSet};

use super::super::workload::Results;

/// What the survivors' fetches came to.
#[derive(Debug, Default, serde::Serialize)]
pub struct StreamCounts {
    pub fetched: u64,
    pub finished: u64,
    /// Failed with a documented error because their producer was a victim.
    pub failed_producer_victim: u64,
    /// Bytes that arrived and were checked, over every stream.
    pub bytes_checked: u64,
    /// Streams that ended any other way (each is a failure of the run).
    pub wrong: u64,
}

/// Judges the fetches in `results`; returns the counts and up to five examples of streams
/// that ended wrongly.
pub fn judge(
    results: &BTreeMap<u32, Results>,
    victims: &BTreeSet<u32>,
) -> (StreamCounts, Vec<String>) {
    let mut c = StreamCounts::default();
    let mut examples = Vec::new();
    for (consumer, r) in results {
        for f in &r.streams {
            c.fetched += 1;
            c.bytes_checked += f.got;
            let documented = matches!(
                f.outcome.as_str(),
                "producer-died" | "node-down" | "timed-out"
            );
            if f.outcome == "finished" && f.got == f.expected {
                c.finished += 1;
            } else if victims.contains(&f.producer) && documented {
                c.failed_producer_victim += 1;
            } else {
                c.wrong += 1;
                if examples.len() < 5 {
                    examples.push(format!(
                        "stream {} from rank {} to rank {}: {} after {} of {} bytes",
                        f.index, f.producer, consumer, f.outcome, f.got, f.expected
                    ));
                }
            }
        }
    }
    (c, examples)
}
