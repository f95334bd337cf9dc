//! The deterministic fault simulator (cargo feature `sim`, always on in tests).
//!
//! N daemons' real protocol state — each a [`crate::node::Node`], the same code a daemon's
//! event loop runs, exchanging encoded frames — run in one thread on a virtual clock and a
//! simulated network: per-link FIFO
//! delivery like TCP with seeded latency, connections lost when a daemon crashes, daemons that
//! stall, links that slow down. Everything follows from one seed, including which kinds of
//! fault the run has at all (swarm testing, `swarm.rs`). A run has a safety phase (faults and
//! traffic; checkers see every delivery and completion) and then a liveness phase (no more
//! faults; within `LIVENESS_US` of virtual time every reliable send must have completed, every
//! daemon's RELM state must be empty, and all survivors must hold the same, correct tree).
//! Broadcasts (from random daemons) and allgathers (every daemon contributes) run under the
//! same faults: every daemon delivers operations in order with no gap and the same content,
//! a completion fires only once every living daemon has the operation, every survivor
//! delivers every operation and gets every allgather result, whose contributions are right and
//! whose excluded ranks are dead ones.
//!
//! * `rng.rs` — the seeded generator. `swarm.rs` — what a seed chooses.
//! * `node.rs` — one daemon: a `Node` and what the checkers collect from its outputs.
//! * `world.rs` — clock, event queue, links, fault injection.
//! * `sweep.rs` — `tbon sim --sweep-radix`: each radix's times under a cost model.
//! * `check.rs` — the checkers.
//! * `frame.rs` — frames on simulated links, header apart, relayed payloads shared.
//!
//! Run it with `tbon sim` (README, "Simulator"); a failure prints the seed, the checker and the
//! command that replays it. Seeds that once failed are kept in `REGRESSION_SEEDS`.

mod check;
mod frame;
mod node;
mod rng;
mod swarm;
pub mod sweep;
pub(crate) mod world;

pub use check::Violation;
pub use swarm::{CrashPattern, FaultKinds, Scenario};
pub use world::{RunStats, World};

/// A seed that found a bug, kept so the bug stays fixed. `tbon sim` and the tests run them
/// first, with the fault kinds they were found with.
#[derive(Debug, Clone, Copy)]
pub struct RegressionSeed {
    /// The seed that found it.
    pub seed: u64,
    /// Daemons in its run.
    pub daemons: u32,
    /// Its radix.
    pub radix: u32,
    /// The fault kinds it was found with.
    pub faults: FaultKinds,
    /// Rank 0's `bcast_part_bytes` in its run, when it was found with one set.
    pub bcast_part_bytes: Option<usize>,
    /// What it found.
    pub found: &'static str,
}

impl RegressionSeed {
    /// The options that replay it with `messages` reliable messages.
    pub fn options(&self, messages: u64) -> Options {
        Options {
            daemons: Some(self.daemons),
            radix: Some(self.radix),
            messages,
            faults: self.faults,
            bcast_part_bytes: self.bcast_part_bytes,
        }
    }
}

/// Seeds that found a bug.
pub const REGRESSION_SEEDS: &[RegressionSeed] = &[
    RegressionSeed {
        seed: 19_933,
        daemons: 3,
        radix: 4,
        faults: FaultKinds::LEGACY,
        bcast_part_bytes: None,
        found: "simulator: overlapping slow-link windows multiplied their factors and blocked a link for hours",
    },
    RegressionSeed {
        seed: 19_683,
        daemons: 34,
        radix: 3,
        faults: FaultKinds::LEGACY,
        bcast_part_bytes: None,
        found: "simulator: a RELM timer delayed by a stall was discarded as stale, so retransmission stopped",
    },
    RegressionSeed {
        seed: 51_432,
        daemons: 9,
        radix: 2,
        faults: FaultKinds::LEGACY,
        bcast_part_bytes: None,
        found: "relm: a hop's Requested record, filled by the replayed data, kept tag 0 and prev NONE; \
         its own replays then posted a user message as runtime tag 0",
    },
    RegressionSeed {
        seed: 28_942,
        daemons: 35,
        radix: 3,
        faults: FaultKinds::LEGACY,
        bcast_part_bytes: None,
        found: "faults: deaths learned from an adoption notice were not reported; when the adopter's \
         own reports died with it (slow link, then a crash), rank 0 never confirmed them and a \
         reliable send spun until it gave up",
    },
    RegressionSeed {
        seed: 82_233,
        daemons: 30,
        radix: 2,
        faults: FaultKinds {
            dup: false,
            stranger: false,
            direct: false,
            stream: false,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "xcast: after a reconnection a parent rewound a child's stream to the child's \
                counted acks (none yet, under another view) instead of where its session began, \
                asked its own parent for operations released long before, and stalled: later \
                fault confirmations never reached that subtree",
    },
    RegressionSeed {
        seed: 112_974,
        daemons: 19,
        radix: 3,
        // Spelled out: a kind added to `ALL` later must not change this seed's scenario.
        faults: FaultKinds {
            crash: true,
            link: true,
            stall: true,
            partition: true,
            delay: true,
            stale: true,
            dup: true,
            stranger: true,
            direct: false,
            stream: false,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "simulator (strangers' runs): a daemon that died with its dial proved and admitted \
                by the peer stayed recorded as redialling for ever, so the run never went quiet",
    },
    RegressionSeed {
        seed: 67,
        daemons: 4,
        radix: 2,
        faults: FaultKinds {
            crash: false,
            link: false,
            stall: false,
            partition: false,
            delay: true,
            stale: false,
            dup: false,
            stranger: false,
            direct: false,
            stream: false,
            overload: true,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "flow: a daemon not scheduled for longer than FLOW_STUCK_MS made its neighbours' \
                queues towards it count as stuck, so they read on and filled those queues to \
                the hard bound, where relayed frames were dropped; a stuck queue near its bound \
                now pauses reads again (FlowLimits::full_bytes)",
    },
    RegressionSeed {
        seed: 27,
        daemons: 6,
        radix: 3,
        faults: FaultKinds {
            crash: false,
            link: false,
            stall: false,
            partition: false,
            delay: true,
            stale: false,
            dup: false,
            stranger: false,
            direct: true,
            stream: false,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "direct links: a daemon that could not dial its peer gave the link up alone; the \
                peer went on sending reliable messages on it, and the acknowledgements went back \
                to the link the first had given up and were dropped, until the origin's \
                retransmissions ran out (Unreachable). Now the one giving up sends Withdraw, and \
                a destination replies by its own route when it no longer reaches the sender",
    },
    RegressionSeed {
        seed: 605_496,
        daemons: 34,
        radix: 8,
        faults: FaultKinds {
            crash: true,
            link: true,
            stall: true,
            partition: true,
            delay: true,
            stale: true,
            dup: true,
            stranger: true,
            direct: true,
            stream: true,
            overload: true,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "direct links (an overload run with short request times): a grant expired \
                unswitched, the two daemons opened a new link on the same connection, and the \
                evicting end's Close of the old link, read then, started closing the new one; \
                the messages held meanwhile waited past the end of the run. Links now carry \
                the grantor's id in every message after the grant (a stale one is ignored), \
                and the simulator waits for messages held by a closing link",
    },
    RegressionSeed {
        seed: 4_712,
        daemons: 5,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            link: true,
            stall: true,
            partition: true,
            delay: true,
            stale: false,
            dup: false,
            stranger: false,
            direct: false,
            stream: true,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "streams: a dropped connection lost a stream's chunks and its End came after on \
                a new one; the consumer failed the stream (a protocol error: ended at 1530, \
                0 bytes arrived) instead of resuming at the byte it stood at, as for a gap",
    },
    RegressionSeed {
        seed: 358,
        daemons: 7,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            link: true,
            stall: true,
            partition: true,
            delay: true,
            stale: false,
            dup: false,
            stranger: false,
            direct: true,
            stream: true,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "direct links: a request delayed past direct_request_ms was given up; the \
                grant came later and the grantor wrote on the link at once, so the requester \
                (waiting for no marker any more) read those frames ahead of older tree \
                messages: plain messages out of order (fixed by direct-link version 4: the \
                grantor writes only after Switch, behind its own marker Ready)",
    },
    RegressionSeed {
        seed: 17_532,
        daemons: 5,
        radix: 8,
        faults: FaultKinds {
            crash: true,
            link: true,
            stall: true,
            partition: true,
            delay: true,
            stale: false,
            dup: false,
            stranger: false,
            direct: true,
            stream: true,
            overload: false,
            status: false,
            group: false,
            client: false,
            rejoin: false,
            grow: false,
            leave: false,
            split: false,
            batch: false,
            return_gathers: false,
        },
        bcast_part_bytes: None,
        found: "direct links: the same race as seed 358 with a radix of 8, and a grant given \
                up unswitched: the grantor must never read what the requester wrote on the \
                link after its late Switch (a fenced link)",
    },
    RegressionSeed {
        seed: 201_472,
        daemons: 2,
        radix: 8,
        faults: FaultKinds::UNTIL_GROUPS,
        bcast_part_bytes: None,
        found: "simulator: link drops between the only two daemons outlasted the redials; both \
                gave up at once, rank 0 declared rank 1 dead and rank 1 rightly stopped with \
                rank 0 lost, which the fencing checker refused in a run without heartbeats",
    },
    RegressionSeed {
        seed: 300_386,
        daemons: 22,
        radix: 8,
        faults: FaultKinds::UNTIL_GROUPS,
        bcast_part_bytes: None,
        found: "status: a daemon that adopted children during a gather (their parent was \
                declared dead while rank 0's query waited for it) did not ask them, and rank \
                0's view after the run showed them unreached",
    },
    RegressionSeed {
        seed: 1_211_495,
        daemons: 6,
        radix: 3,
        faults: FaultKinds::UNTIL_GROUPS,
        bcast_part_bytes: None,
        found: "simulator: a daemon that dialled a peer, stalled, and was stopped (declared \
                dead) when it woke left its redial recorded for ever, and the run never \
                counted as quiet (liveness)",
    },
    RegressionSeed {
        seed: 204_929,
        daemons: 39,
        radix: 2,
        faults: FaultKinds::UNTIL_GROUPS,
        bcast_part_bytes: None,
        found: "simulator: a consumer partitioned from its producer for longer than the \
                stream's idle time rightly failed the stream TimedOut before anyone declared \
                it dead; the stream checker allowed that only with the producer gone",
    },
    RegressionSeed {
        seed: 229,
        daemons: 5,
        radix: 3,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: the world's handshake (as the driver's) told a restarted daemon, a newer incarnation, that it was declared dead; and a daemon learnt a peer's newer incarnation from its frames before the DVM confirmed the old one's death, then refused the new one as dead (incarnations now learnt at first contact or from a restore only)",
    },
    RegressionSeed {
        seed: 3,
        daemons: 11,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a restore confirmed after this daemon had seen the restored incarnation die again undid that death, parenting it to a dead daemon",
    },
    RegressionSeed {
        seed: 32,
        daemons: 35,
        radix: 8,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a fault confirmation older than a restore an adoption notice had brought failed the restored rank again for good",
    },
    RegressionSeed {
        seed: 161,
        daemons: 20,
        radix: 8,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a welcomed daemon did not know the restores before its admission, so a child that still believed a restored rank dead never reached its parent's view and its subtree's broadcasts stalled (the welcome carries rank 0's latest restores)",
    },
    RegressionSeed {
        seed: 99,
        daemons: 23,
        radix: 3,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a reliable message sent to a rank before its sender learnt of its death reached the daemon restarted under that rank (lives in every header now)",
    },
    RegressionSeed {
        seed: 620,
        daemons: 10,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a detection planned for a rank's earlier life was dropped as moot while the detecting daemon still believed in that life, so it kept a dead parent",
    },
    RegressionSeed {
        seed: 777,
        daemons: 38,
        radix: 3,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a daemon waiting for its welcome posted a message meant for its previous incarnation (it now takes only rank 0's answer)",
    },
    RegressionSeed {
        seed: 385,
        daemons: 26,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: an adoption notice from a later life of a rank its child believed alive was dropped as of another life; the child kept the dead life as its parent",
    },
    RegressionSeed {
        seed: 201,
        daemons: 33,
        radix: 2,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: the new parent's Sync overtook rank 0's welcome and was dropped by the waiting daemon; nothing offered it again, and the subtree below never got the admission's broadcast (frames before the welcome are now kept and read after it)",
    },
    RegressionSeed {
        seed: 1147,
        daemons: 17,
        radix: 2,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a daemon that learnt a restore from an adoption notice (its epoch still older than the restore's) reported the new life's death, and rank 0 took it for news of the old life (reports and notices now carry each dead rank's life, not the sender's epoch)",
    },
    RegressionSeed {
        seed: 20202,
        daemons: 23,
        radix: 2,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a confirmation of a rank's first return, delayed behind the adoption notice of its second, took the rank's life back to the first; the daemon then dropped every frame of the rank's live incarnation and its reliable messages ended Unreachable (a restore of an earlier life than the one known is now ignored)",
    },
    RegressionSeed {
        seed: 27070,
        daemons: 7,
        radix: 3,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "simulator: a restarted daemon, still waiting for its welcome, was handed its dead predecessor's detection of its parent and stopped with \"cannot reach rank 0\" (a detection is now moot once its detector restarted)",
    },
    RegressionSeed {
        seed: 5094,
        daemons: 14,
        radix: 4,
        faults: REJOIN_MIXED,
        bcast_part_bytes: None,
        found: "simulator: the run ended while a restarted daemon still waited for rank 0 (stalled) to answer, and the tree checker saw it alive but failed at rank 0 (a daemon rejoining is now work left)",
    },
    RegressionSeed {
        seed: 5357,
        daemons: 27,
        radix: 4,
        faults: REJOIN_MIXED,
        bcast_part_bytes: None,
        found: "rejoin: a daemon waiting for its welcome stopped with \"cannot reach rank 0\" when a tree neighbour of its slot proved unreachable (only rank 0 matters before the welcome)",
    },
    RegressionSeed {
        seed: 205,
        daemons: 29,
        radix: 2,
        faults: FaultKinds {
            crash: true,
            grow: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "grow: a rank that joined and died was passed on by a later joiner as a death of life 0 (its welcome named the dead without their lives), and a daemon that knew life 1 ignored it as older news, so the subtree below it never synchronised again (the welcome now carries the lives of the dead)",
    },
    RegressionSeed {
        seed: 1114,
        daemons: 30,
        radix: 3,
        faults: FaultKinds {
            crash: true,
            grow: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "grow: a daemon told of a joined rank's death while it still believed the rank absent later applied the confirmation of its join, and kept a dead rank alive (the latest life known to have died is now kept per rank, and a restore of it is older news)",
    },
    RegressionSeed {
        seed: 2336,
        daemons: 25,
        radix: 2,
        faults: FaultKinds {
            crash: true,
            grow: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "grow: a daemon that skipped a stale restore named the death as of the last life it had restored (none), and its child, which had applied the restore, took the death for older news (deaths are now passed on with the latest life known to have died)",
    },
    RegressionSeed {
        seed: 178,
        daemons: 11,
        radix: 4,
        faults: FaultKinds {
            crash: true,
            rejoin: true,
            return_gathers: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a returned daemon whose application contributed to an allgather finished before its return waited for ever for its child, which had the result and sent nothing (a returned daemon now asks the children it waits for, and one that finished answers with the result)",
    },
    RegressionSeed {
        seed: 12098,
        daemons: 26,
        radix: 8,
        faults: FaultKinds {
            return_gathers: true,
            ..REJOIN_MIXED
        },
        bcast_part_bytes: None,
        found: "rejoin: a rank's return brought the failed set, and so the view digest, back to an earlier one; a parent that had sent its child a Sync under that digest before sent none for the new view, and the child's contribution made under the view between stayed uncounted (what was sent under a digest is forgotten at every view change)",
    },
    RegressionSeed {
        seed: 10332,
        daemons: 15,
        radix: 2,
        // REJOIN_MIXED's faults, with grow instead of rejoin.
        faults: FaultKinds {
            rejoin: false,
            grow: true,
            return_gathers: true,
            ..REJOIN_MIXED
        },
        bcast_part_bytes: None,
        found: "grow: a joined daemon asked its child (also joined) for an allgather's result; the child, unfinished then, got the result later from its own child and passed it only down, so the parent waited for ever (a daemon whose parent asked now sends it the result when it arrives)",
    },
    RegressionSeed {
        seed: 1124,
        daemons: 14,
        radix: 8,
        faults: FaultKinds {
            crash: true,
            grow: true,
            return_gathers: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "grow: a joined daemon whose parent died sent its allgather contribution to rank 0 before rank 0 knew it as a child; rank 0 had finished the collective and did not answer a stranger, and the joined daemon, which had missed the result's broadcast, waited for ever (late contributions are now answered whoever sends them)",
    },
    RegressionSeed {
        seed: 20748,
        daemons: 13,
        radix: 2,
        // `all` when it was found, before rejoin joined it.
        faults: FaultKinds {
            rejoin: false,
            ..ALL_REJOIN
        },
        bcast_part_bytes: None,
        found: "allgather: a rank listed as excluded by a child that only suspected it (a local repair rank 0 never confirmed) was taken for a rank that had died and returned, excused, and left out of the result while alive (only restores excuse a rank now; a daemon that learns of one sends its contribution again)",
    },
    RegressionSeed {
        seed: 164,
        daemons: 20,
        radix: 2,
        faults: ALL_REJOIN,
        bcast_part_bytes: None,
        found: "groups: a member restarted after its call time never called the group's first collective, and rank 0 waited for its new life for ever (members restored while a group collective is held are excused, as in the allgather)",
    },
    RegressionSeed {
        seed: 2569,
        daemons: 17,
        radix: 3,
        faults: ALL_REJOIN,
        bcast_part_bytes: None,
        found: "rejoin: a rejoining daemon whose dial to rank 0 failed once (a link down) stopped as if rank 0 were lost, and stayed a rejoin in progress for ever (it now asks again until its deadline)",
    },
    RegressionSeed {
        seed: 2822,
        daemons: 3,
        radix: 3,
        faults: ALL_REJOIN,
        bcast_part_bytes: None,
        found: "rejoin: rank 0's welcome was lost with a connection, rank 0 declared the admitted incarnation dead again, and the daemon waited 240 s for an answer its handshake had already refused (it now stops at the \"declared dead\" and is started again)",
    },
    RegressionSeed {
        seed: 146,
        daemons: 4,
        radix: 3,
        faults: FaultKinds {
            grow: true,
            ..ALL_REJOIN
        },
        bcast_part_bytes: None,
        found: "checker: a reliable message to a joined daemon ended NodeDown when the daemon was declared dead during a stall, and the still-running life posted it afterwards; the checker had taken it out of the pair's sequence for good (it takes its place again)",
    },
    RegressionSeed {
        seed: 1256,
        daemons: 35,
        radix: 2,
        faults: FaultKinds {
            grow: true,
            ..ALL_REJOIN
        },
        bcast_part_bytes: None,
        found: "groups: a joined daemon got two group results from its former parent after a later joiner had become its parent, which then waited for its subtree for ever (a result from a daemon other than the parent is now announced to the parent with `Have`)",
    },
    RegressionSeed {
        seed: 90,
        daemons: 38,
        radix: 2,
        faults: FaultKinds {
            grow: true,
            ..ALL_REJOIN
        },
        bcast_part_bytes: None,
        found: "simulator: a daemon that crashed while being admitted, and was never started again, stayed a rejoin in progress, so the run never went quiet",
    },
    RegressionSeed {
        seed: 402,
        daemons: 13,
        radix: 3,
        faults: FaultKinds {
            rejoin: false,
            leave: true,
            ..REJOIN_MIXED
        },
        bcast_part_bytes: None,
        found: "leave: a leaving daemon stalled past the heartbeat timeout before its request reached rank 0; declared dead, it ignored every refusal as a leaving daemon and stopped 30 s later with a fatal error (rank 0's refusal now says left or declared dead, and it stops at once)",
    },
    RegressionSeed {
        seed: 35,
        daemons: 27,
        radix: 2,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "xcast (found once the simulator ran link sessions): a child whose parent went 9 -> 25 -> 9 in two repairs dropped the operations 9 streamed meanwhile as not its parent's, then waited for a `Sync` that 9, whose view never changed, had no reason to send; every broadcast stalled (a child now says where it stands to each new parent at once: an unasked `Resume`)",
    },
    RegressionSeed {
        seed: 2825,
        daemons: 4,
        radix: 8,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "simulator: the frames waiting for a direct connection that could not be made were dropped before the node's fallback could move them to the tree (the driver lets the node decide first); 8 plain messages lost, found by the link-sessions checker",
    },
    RegressionSeed {
        seed: 11_549,
        daemons: 9,
        radix: 2,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "direct links: rank 5 granted rank 0 a link and left their one connection unread until rank 0's `Switch`; rank 0 never had the grant (it went through rank 1, which was leaving) and adopted rank 5 once rank 1 had left, so its adoption notice and confirmations came over that unread connection; rank 5 never learnt of the repair and stopped after 30 s unconfirmed (now only the peer's own messages wait for its marker, in the node: `node/marker_wait.rs`)",
    },
    RegressionSeed {
        seed: 128,
        daemons: 6,
        radix: 3,
        faults: FaultKinds::ALL,
        bcast_part_bytes: Some(40),
        found: "direct links, as seed 11549, found with broadcasts in parts (which only changed the timing): rank 5 waited for rank 0's drain marker on the connection over which rank 0, its new parent after rank 2 left, sent its adoption notice",
    },
    RegressionSeed {
        seed: 12_395,
        daemons: 21,
        radix: 2,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "status: rank 6 adopted rank 18 (its parent 10 stalled and was declared dead) during a status query and asked it at once, before its adoption notice (which goes with the collectives' `Sync`); rank 18 answered by the tree, through dead rank 10, and rank 0's status showed no answer from a living daemon (an answer to an asker that is not a tree neighbour now goes back over the link the query came on)",
    },
    RegressionSeed {
        seed: 24_616,
        daemons: 25,
        radix: 8,
        faults: FaultKinds {
            split: true,
            batch: false,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "rejoin (found by `all,split`; the parts only changed the timing): rank 21, admitted back, adopted rank 13 while 13 still waited for its own welcome; 13 applied 21's adoption notice at once (it believed 21 dead), and the welcome then put back the older view, without rank 4's later restore; 13 never answered 21's `Sync` under 21's view, and every broadcast from operation 106 on stalled (an adopter's notice now waits for the welcome, in order with the `Sync` behind it)",
    },
    RegressionSeed {
        seed: 25_715,
        daemons: 21,
        radix: 8,
        faults: FaultKinds {
            split: true,
            batch: false,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "rejoin (found by `all,split`): rank 15 restarted twice; rank 0 sent incarnation 2's welcome again when its request came again, and by then the rank's connection was incarnation 3's, which took the welcome as its own, was never admitted, and never exited when declared dead (a welcome now names the incarnation it admits)",
    },
    RegressionSeed {
        seed: 28_614,
        daemons: 27,
        radix: 4,
        faults: FaultKinds {
            split: true,
            batch: false,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "simulator: a restarted rank kept its old life's handshake state; its dial to rank 3, under way when it left, counted as a crossing dial for ever, so it refused every dial of its parent and a reliable message to it was given up after 32 retransmissions (a restart now starts with no handshake state)",
    },
    RegressionSeed {
        seed: 27_373,
        daemons: 7,
        radix: 2,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "simulator, as seed 28614: rank 1, restarted twice, closed a connection with rank 5 that the arbiter had admitted, deciding from its previous life's handshake state (checker `links`)",
    },
    RegressionSeed {
        seed: 31_828,
        daemons: 10,
        radix: 3,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "RELM across a rejoin: rank 1's re-acknowledgement of rank 5's chain (upto 2), sent before 5's first life was declared dead and delayed in flight, reached rank 5's admitted life, which numbers from 0 again, and completed its message 2 before it was posted (checker `completion`; an ack now names the origin's life)",
    },
    RegressionSeed {
        seed: 66_614,
        daemons: 26,
        radix: 4,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "direct links and rejoin (found by `all,split`): rank 0 evicted its direct link with rank 21, admitted back, and then wrote 21's `Settled` on that link's connection after `Close`; the connection closed with it, and 21 held its application's sends for ever (checker `liveness`; a frame written straight to a daemon whose link ends now takes the tree behind the close)",
    },
    RegressionSeed {
        seed: 113_428,
        daemons: 12,
        radix: 2,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "simulator (overload): the scenario's flow limits left room below a queue's hard bound for one read but not for one more frame of the longest kind, as the daemon's own rule does; with rank 0 stalled past FLOW_STUCK_MS, rank 1's stuck queue to it took a relayed 57 KB stream chunk past the bound (checker `overload`)",
    },
    RegressionSeed {
        seed: 109_209,
        daemons: 37,
        radix: 2,
        faults: FaultKinds {
            split: true,
            batch: false,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "status across a rejoin: rank 8 kept answering a query of rank 4's previous life after 4 died; 4's next life asked under the same id and took that answer's timing as its own, and the clock offset it reported was 310 ms off (checker `status`; a dead asker's queries are now dropped)",
    },
    RegressionSeed {
        seed: 64_144,
        daemons: 32,
        radix: 8,
        faults: FaultKinds::ALL,
        bcast_part_bytes: None,
        found: "status (found by `all,split`): rank 0 adopted the heir 21 during its status query and asked it before its adoption notice; 21 answered under its old view, without the child 13 it got by the same repair, and the report showed 13 unreached (checker `status`; an adopted child is now asked right after its notice)",
    },
    RegressionSeed {
        seed: 284,
        daemons: 4,
        radix: 3,
        faults: FaultKinds {
            direct: true,
            stream: true,
            overload: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "bulk connections (`world/bulk_wire.rs`): a direct link's marker that went straight to the link's queue was not counted with the link's fed bulk frames, so the handover to the bulk connection did not wait for it, and rank 0 relayed a stream chunk to 3 that overtook the marker (checker `bulk-order`; a marker queued on the link now counts as fed, `Conn::push`)",
    },
    RegressionSeed {
        seed: 358,
        daemons: 7,
        radix: 4,
        faults: FaultKinds {
            direct: true,
            batch: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "direct links (found first by `tests/direct.rs`, then by the `direct` kind's bursts, `swarm::bursts`): a batch frame of 6's plain messages read on the new link before 6's drain marker was delivered at once, ahead of 6's last messages over the tree (checker `plain-in-order`, 6->3: #49 after #75; batch frames now wait for the marker as single messages do, `node/marker_wait.rs`). Before the bursts, 5,060 seeds of `direct,batch` passed with the bug; with them, 327 of 1,061 fail",
    },
    RegressionSeed {
        seed: 308_097,
        daemons: 23,
        radix: 4,
        faults: FaultKinds {
            batch: true,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "overload with the `direct` kind's bursts (`swarm::bursts`): rank 2 evicted its idle direct link to 1 while a burst to 1 began; what it sent meanwhile was held until the `CloseAck`, 21 ms under load, past the flow-control mark (the origin gate looked only at the tree's queue, then uncongested), and handed to the tree's queue to 0 at once: 35 frames dropped at its hard bound (checker `overload`). The gate now refuses sends to a daemon whose held messages reach the high-water mark, and released messages enter the tree's queue only while it is not congested, later ones behind them (`node/direct_held.rs`)",
    },
    RegressionSeed {
        seed: 802_624,
        daemons: 5,
        radix: 2,
        faults: FaultKinds {
            batch: true,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "overload (with the bursts): frames waiting for a connection that was down were not counted as queued, so the origin gate stayed open and rank 4 kept sending to 1; when the connection came up they entered its queue at once, past the hard bound (19 frames dropped, checker `overload`). Waiting frames now count in the queue's level, in the driver (`report_waiting`, `peer_levels`) and the simulator (`report_queue`); seeds 804094 and 805020 (a direct link's connection) found the same",
    },
    RegressionSeed {
        seed: 805_020,
        daemons: 6,
        radix: 2,
        faults: FaultKinds {
            batch: true,
            ..FaultKinds::ALL
        },
        bcast_part_bytes: None,
        found: "overload: as seed 802624, on the connection of a direct link rank 3 granted while stalled (28 frames dropped)",
    },
    RegressionSeed {
        seed: 27,
        daemons: 330,
        radix: 32,
        faults: FaultKinds {
            grow: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "rejoin: a welcome names only the latest 256 restores; a daemon that joined after more \
         took the earlier joiners for their first life, and messages between them were dropped \
         both ways (a reliable send gave up Unreachable; seed 1 of all at 600 daemons too)",
    },
    RegressionSeed {
        seed: 305,
        daemons: 400,
        radix: 8,
        faults: FaultKinds {
            group: true,
            ..FaultKinds::NONE
        },
        bcast_part_bytes: None,
        found: "simulator: a fence's gets beside another fence's still in flight passed \
         MODEX_FETCHES_MAX at the asker, whose Busy (the designed answer) the group checker \
         took only in a group larger than the bound",
    },
];

/// `all` and `rejoin` when the seeds found with them were (spelled out: a kind added to
/// `ALL` later must not change them).
const ALL_REJOIN: FaultKinds = FaultKinds {
    crash: true,
    link: true,
    stall: true,
    partition: true,
    delay: true,
    stale: true,
    dup: true,
    stranger: true,
    direct: true,
    stream: true,
    overload: true,
    status: true,
    group: true,
    client: true,
    rejoin: true,
    grow: false,
    leave: false,
    split: false,
    batch: false,
    return_gathers: true,
};

/// The kinds of the rejoin seeds found mixed with link, stall, partition, delay, stale and dup.
const REJOIN_MIXED: FaultKinds = FaultKinds {
    crash: true,
    link: true,
    stall: true,
    partition: true,
    delay: true,
    stale: true,
    dup: true,
    rejoin: true,
    ..FaultKinds::NONE
};

/// What to simulate.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Daemons; `None` picks 2..=40 per seed.
    pub daemons: Option<u32>,
    /// Radix; `None` picks one of 2, 3, 4, 8 per seed.
    pub radix: Option<u32>,
    /// Reliable messages per run (plain messages: half as many).
    pub messages: u64,
    /// The kinds of fault a seed may choose from.
    pub faults: FaultKinds,
    /// Rank 0's `bcast_part_bytes` in every seed, instead of the scenario's (the `split`
    /// kind's choice, or the daemon's default).
    pub bcast_part_bytes: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            daemons: None,
            radix: None,
            messages: 200,
            faults: FaultKinds::UNTIL_GROUPS,
            bcast_part_bytes: None,
        }
    }
}

/// One seed's outcome.
#[derive(Debug, Clone)]
pub struct SeedOutcome {
    /// The seed.
    pub seed: u64,
    /// The DVM size it ran.
    pub daemons: u32,
    /// The radix it ran.
    pub radix: u32,
    /// The fault kinds it could choose from.
    pub faults: FaultKinds,
    /// Rank 0's `bcast_part_bytes`, if the run set it.
    pub bcast_part_bytes: Option<usize>,
    /// The counts, or the first broken rule.
    pub result: Result<RunStats, Violation>,
}

impl SeedOutcome {
    /// The command that replays this seed exactly.
    pub fn replay_command(&self, messages: u64) -> String {
        format!(
            "cargo run --release -- sim --seed {} --daemons {} --radix {} --messages {messages} --faults {}{}",
            self.seed,
            self.daemons,
            self.radix,
            self.faults,
            self.bcast_part_bytes
                .map_or(String::new(), |p| format!(" --bcast-part-bytes {p}"))
        )
    }
}

/// Runs one seed.
pub fn run_seed(seed: u64, opts: Options) -> SeedOutcome {
    let mut rng = rng::Rng::new(seed ^ 0xD1CE);
    let daemons = opts.daemons.unwrap_or_else(|| rng.range(2, 40) as u32);
    let radix = opts.radix.unwrap_or_else(|| match rng.range(0, 3) {
        0 => 2,
        1 => 3,
        2 => 4,
        _ => 8,
    });
    // A broken invariant (`bug!`) panics in the simulator; it is this seed's violation.
    let run = std::panic::catch_unwind(|| {
        World::new(
            seed,
            daemons,
            radix,
            opts.messages,
            (opts.faults, opts.bcast_part_bytes),
        )
        .map_err(|e| Violation {
            checker: "setup",
            detail: e,
        })
        .and_then(|mut w| w.run())
    });
    let result = run.unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into());
        Err(Violation {
            checker: "invariant",
            detail,
        })
    });
    SeedOutcome {
        seed,
        daemons,
        radix,
        faults: opts.faults,
        bcast_part_bytes: opts.bcast_part_bytes,
        result,
    }
}

#[cfg(test)]
mod tests;
