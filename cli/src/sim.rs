//! `tbon sim`: run the deterministic fault simulator over many seeds (or replay one) and print
//! a summary; for a failure, the seed, the checker that failed, and the command that replays it.
use clap::Args;
use std::time::Instant;
use tbon::sim::{FaultKinds, Options, REGRESSION_SEEDS, SeedOutcome, run_seed};

/// Arguments of `tbon sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Seeds to run: FIRST..FIRST+N (see --first).
    #[arg(long, default_value_t = 1000, conflicts_with = "seed")]
    pub seeds: u64,
    /// The first seed of a --seeds run.
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Run only this seed (a replay) and print its outcome and statistics (a failing seed's
    /// violation names the checker and what broke).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Daemons per run (default: chosen per seed, 2 to 40).
    #[arg(long)]
    pub daemons: Option<u32>,
    /// Radix (default: chosen per seed among 2, 3, 4, 8).
    #[arg(long)]
    pub radix: Option<u32>,
    /// Reliable messages per run (plain messages: half as many).
    #[arg(long, default_value_t = 200)]
    pub messages: u64,
    /// The kinds of fault seeds choose from (each seed picks its own mix): a comma-separated
    /// list of crash, link, stall, partition, delay, stale, dup, stranger, direct, stream, overload,
    /// status, group, client, rejoin, grow, leave; split and batch (opt-in: the workload's
    /// broadcasts pipelined in parts; its small messages packed into batch frames); or all
    /// (every kind but split and batch). The regression seeds run first, each with the kinds
    /// it was found with, whatever this says.
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Rank 0's `bcast_part_bytes` in every seed (the workload's broadcasts are 20 to 84
    /// bytes: below that they are split into parts), instead of the daemon's default or the
    /// `split` kind's choice. With --sweep-radix: the timed broadcast's parts (0: stored and
    /// forwarded whole at each level, as PRRTE does) [default: the daemon's, 262144].
    #[arg(long)]
    pub bcast_part_bytes: Option<usize>,
    /// Stop at the first failing seed.
    #[arg(long)]
    pub fail_fast: bool,
    #[command(flatten)]
    pub sweep: super::sweep::SweepArgs,
}

/// Runs `tbon sim`; exit code 1 if any seed failed.
pub fn run(args: SimArgs) -> Result<i32, String> {
    // Thousands of simulated daemons log what a real one would (every repair, every death):
    // nothing shows (a fenced daemon logs an error, as it should), unless RUST_LOG asks (say,
    // to replay one seed); a broken invariant is the seed's violation either way.
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Off);
    }
    if args.sweep.sweep_radix {
        return super::sweep::run(&args.sweep, args.daemons, args.bcast_part_bytes);
    }
    super::sweep::check_unused(&args.sweep)?;
    let faults = FaultKinds::parse(&args.faults)?;
    let opts = Options {
        daemons: args.daemons,
        radix: args.radix,
        messages: args.messages,
        faults,
        bcast_part_bytes: args.bcast_part_bytes,
    };
    if let Some(seed) = args.seed {
        let o = run_seed(seed, opts);
        return Ok(report_one(&o, args.messages, true));
    }
    let started = Instant::now();
    let mut failed = 0u64;
    let mut ran = 0u64;
    let (mut events, mut posted, mut crashed, mut retransmits) = (0u64, 0u64, 0u64, 0u64);
    let (mut ops, mut gathers, mut split) = (0u64, 0u64, 0u64);
    let (mut fenced, mut link_drops, mut stale, mut dups) = (0u64, 0u64, 0u64, 0u64);
    let (mut strangers, mut refused, mut crossed) = (0u64, 0u64, 0u64);
    let (mut busy, mut unread) = (0u64, 0u64);
    let (mut bulk_moved, mut bulk_syncs, mut batch_frames) = (0u64, 0u64, 0u64);
    let mut relm_batches = 0u64;
    let (mut opened, mut fallbacks, mut held, mut evicted) = (0u64, 0u64, 0u64, 0u64);
    let (mut streams, mut streams_failed, mut statuses) = (0u64, 0u64, 0u64);
    let (mut group_results, mut modex_gets, mut client_messages) = (0u64, 0u64, 0u64);
    let regression_count = REGRESSION_SEEDS.len();
    let regressions = REGRESSION_SEEDS
        .iter()
        .map(|r| (r.seed, r.options(args.messages)));
    let seeds = (args.first..args.first.saturating_add(args.seeds)).map(|s| (s, opts));
    for (seed, o) in regressions.chain(seeds) {
        let out = run_seed(seed, o);
        ran += 1;
        match &out.result {
            Ok(s) => {
                events += s.events;
                posted += s.reliable_posted;
                crashed += u64::from(s.crashed);
                retransmits += s.retransmits;
                ops += s.bcast_ops;
                split += s.bcast_split;
                gathers += s.gathers;
                fenced += u64::from(s.fenced);
                link_drops += s.link_drops;
                stale += s.stale_dropped;
                dups += s.duplicated;
                strangers += s.strangers;
                refused += s.strangers_refused;
                crossed += s.dials_crossed;
                busy += s.sends_busy;
                unread += s.unread_frames;
                bulk_moved += s.bulk_moved;
                bulk_syncs += s.bulk_syncs;
                batch_frames += s.batch_frames;
                relm_batches += s.relm_batch_frames;
                opened += s.direct_opened;
                fallbacks += s.direct_fallbacks;
                held += s.held_frames;
                evicted += s.direct_evicted;
                streams += s.streams_finished;
                streams_failed += s.streams_failed;
                statuses += s.statuses;
                group_results += s.group_results;
                modex_gets += s.modex_gets;
                client_messages += s.client_messages;
            }
            Err(_) => {
                failed += 1;
                report_one(&out, args.messages, false);
                if args.fail_fast {
                    break;
                }
            }
        }
    }
    println!(
        "tbon sim: {ran} seeds ({regression_count} regression seeds with their own fault kinds, \
         then the ones asked for), {failed} failed, in {:.1} s: {events} events, {posted} reliable \
         messages posted, {ops} broadcasts ({split} split into parts), {gathers} allgather results, {crashed} daemons \
         crashed, {fenced} declared dead and fenced, {link_drops} connections dropped, {stale} \
         stale frames dropped, {dups} frames duplicated, {retransmits} retransmissions, \
         {strangers} strangers' connections ({refused} refused at a forged proof), {crossed} \
         crossing dials resolved, {busy} sends refused Busy by flow control, {unread} frames \
         left unread by flow control, {batch_frames} batch frames sent ({relm_batches} reliable), {bulk_moved} frames moved to bulk connections \
         ({bulk_syncs} syncs for a marker), {opened} direct links opened (ends), {evicted} evicted, \
         {fallbacks} fallbacks to the tree, {held} frames held for a drain marker, {streams} \
         streams finished ({streams_failed} ended by a dead producer), {statuses} status \
         queries answered, {group_results} group collective results, {modex_gets} data-exchange \
         gets, {client_messages} client messages",
        started.elapsed().as_secs_f64()
    );
    Ok(if failed == 0 { 0 } else { 1 })
}

fn report_one(o: &SeedOutcome, messages: u64, verbose: bool) -> i32 {
    match &o.result {
        Ok(s) => {
            if verbose {
                println!(
                    "seed {}: PASS ({} daemons, radix {}): {s:?}",
                    o.seed, o.daemons, o.radix
                );
                if let Some((took_us, depth, hop_us)) = s.last_status {
                    println!(
                        "rank 0's status after the run: {took_us} us of virtual time over a tree \
                         of depth {depth}, {hop_us} us per hop ({:.2}x depth x 2 hops)",
                        took_us as f64 / (2.0 * f64::from(depth.max(1)) * hop_us.max(1) as f64)
                    );
                }
            }
            0
        }
        Err(v) => {
            println!(
                "seed {}: FAIL ({} daemons, radix {}): checker {}: {}\n  replay: {}",
                o.seed,
                o.daemons,
                o.radix,
                v.checker,
                v.detail,
                o.replay_command(messages)
            );
            1
        }
    }
}
