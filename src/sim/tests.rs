//! The simulator's own tests: determinism, the checkers catch what they should, and a batch of
//! seeds (CI runs many more through `tbon sim`).

use super::*;

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 2, 3] {
        let a = run_seed(seed, Options::default());
        let b = run_seed(seed, Options::default());
        let (a, b) = (a.result.unwrap(), b.result.unwrap());
        assert_eq!(a.events, b.events);
        assert_eq!(a.end_us, b.end_us);
        assert_eq!(a.reliable_posted, b.reliable_posted);
    }
}

#[test]
fn payload_checks_catch_corruption() {
    let p = check::payload(1, 2, 3, 5);
    assert_eq!(check::parse(&p), Some((1, 2, 3)));
    let mut bad = p.to_vec();
    bad[3] ^= 1;
    assert_eq!(check::parse(&bad), None);
    assert_eq!(check::parse(&[]), None);
}

#[test]
fn regression_seeds_pass() {
    for &(seed, daemons, radix, what) in REGRESSION_SEEDS {
        let o = run_seed(
            seed,
            Options {
                daemons: Some(daemons),
                radix: Some(radix),
                messages: 200,
            },
        );
        assert!(
            o.result.is_ok(),
            "regression seed {seed} ({what}): {:?}",
            o.result
        );
    }
}

#[test]
fn a_hundred_seeds_pass() {
    for seed in 0..100 {
        let o = run_seed(seed, Options::default());
        assert!(
            o.result.is_ok(),
            "seed {seed} ({} daemons, radix {}): {:?}\nreplay: {}",
            o.daemons,
            o.radix,
            o.result,
            o.replay_command(200)
        );
    }
}
