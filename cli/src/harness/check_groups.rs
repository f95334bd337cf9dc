//! The harness's judgement of pattern `group` (issue "Jobs"): for every collective of every
//! group, every surviving member must have ended it `ok` (a broadcast whose root was a victim
//! may instead end `root-died`), all with the same result digest, and no result may exclude a
//! survivor. A fence's outcome is `ok` when every member's endpoint read back right; members
//! whose get said `NodeDown` are listed with the excluded, and must be victims (members may
//! differ there: a member killed after one fetched its data and before another did). Victims'
//! collectives are not judged: they wrote no results. A victim restarted with `--restart`, or
//! a rank that joined with `--grow` (returned), is judged by its new life's results, which call
//! every collective from the first: each must end `ok` with the survivors' result, or
//! `result-lost` (finished before the return and no longer cached on the way); survivors may
//! exclude it (it was dead or absent when the collective ran), and a get of its data may find
//! nothing until its new life commits (`docs/architecture.md`, "Groups across a return").

use std::collections::{BTreeMap, BTreeSet};

use super::super::group_workload::{Collected, groups, kind};
use super::super::workload::Results;

/// What the survivors' group collectives came to.
#[derive(Debug, Default, serde::Serialize)]
pub struct GroupCounts {
    /// Groups in the run, and collectives (group, number) judged.
    pub groups: u64,
    pub collectives: u64,
    /// Members' outcomes judged, and those `ok`.
    pub outcomes: u64,
    pub ok: u64,
    /// Broadcasts ended `root-died` at a member because their root was a victim.
    pub root_died: u64,
    /// Outcomes at restarted members ended `result-lost`.
    pub returned_lost: u64,
    /// Results that excluded a victim (its contribution never reached the tree).
    pub excluded_victims: u64,
    /// Outcomes that are wrong (each is a failure of the run): a missing or failed outcome,
    /// wrong bytes, a digest that differs from another member's, a survivor excluded.
    pub wrong: u64,
}

/// Judges the group collectives in `results`; the counts and up to five examples of wrong
/// outcomes.
pub fn judge(
    results: &BTreeMap<u32, Results>,
    victims: &BTreeSet<u32>,
    returned: &BTreeSet<u32>,
    (seed, size, group_size, rounds): (u64, u32, u32, u64),
) -> (GroupCounts, Vec<String>) {
    let mut c = GroupCounts::default();
    let mut examples = Vec::new();
    let mut wrong = |c: &mut GroupCounts, what: String| {
        c.wrong += 1;
        if examples.len() < 5 {
            examples.push(what);
        }
    };
    let all = groups(seed, size, group_size);
    c.groups = all.len() as u64;
    for (index, (_, members)) in all.iter().enumerate() {
        for seq in 0..rounds {
            c.collectives += 1;
            let (what, root) = kind(seq, members);
            let mut digest: Option<u64> = None;
            for m in members
                .iter()
                .filter(|m| !victims.contains(m) || returned.contains(m))
            {
                c.outcomes += 1;
                let got: Option<&Collected> = results.get(m).and_then(|r| {
                    r.groups
                        .iter()
                        .find(|g| g.group == index as u64 && g.seq == seq)
                });
                let Some(got) = got else {
                    wrong(
                        &mut c,
                        format!("{what} {seq} of group {index}: no outcome at member {m}"),
                    );
                    continue;
                };
                let root_victim = root.is_some_and(|r| victims.contains(&r));
                match got.outcome.as_str() {
                    "ok" => c.ok += 1,
                    "root-died" if root_victim => {
                        c.root_died += 1;
                        continue;
                    }
                    "result-lost" if returned.contains(m) => {
                        c.returned_lost += 1;
                        continue;
                    }
                    other => {
                        wrong(
                            &mut c,
                            format!("{what} {seq} of group {index} at member {m}: {other}"),
                        );
                        continue;
                    }
                }
                if let Some(x) = got
                    .excluded
                    .iter()
                    .find(|x| !victims.contains(x) && !returned.contains(x))
                {
                    wrong(
                        &mut c,
                        format!("{what} {seq} of group {index}: survivor {x} excluded"),
                    );
                }
                if what.ends_with("fence") {
                    c.excluded_victims += got.excluded.len() as u64;
                    continue;
                }
                match digest {
                    None => {
                        digest = Some(got.digest);
                        c.excluded_victims += got.excluded.len() as u64;
                    }
                    Some(d) if d != got.digest => wrong(
                        &mut c,
                        format!("{what} {seq} of group {index}: member {m}'s result differs"),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    (c, examples)
}
