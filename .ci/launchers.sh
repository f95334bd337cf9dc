#!/usr/bin/env bash
# tbon under real launchers (issue #27): the README's one-command form under Open MPI's mpirun
# with 8 and 32 daemons, the same under mpirun's PMIx variables alone (PMIX_RANK + TBON_SIZE),
# and one daemon SIGKILLed under `mpirun --enable-recovery` (the tree repairs, the survivors
# stop cleanly). For every run: each daemon prints its `--ping-all` self-test line, SIGTERM to
# rank 0 stops the DVM, every daemon exits 0 and logs no WARN, ERROR or "probing" line, and
# rank 0 removes its URI file.
#
# Usage: bash .ci/launchers.sh            (called by .ci/run after `cargo test --release`)
#        TBON=/path/to/tbon bash .ci/launchers.sh
#        LAUNCHERS_SIZES="8" bash .ci/launchers.sh
# Installs openmpi-bin with apt-get when mpirun is missing (as root); without either it prints
# a SKIP line and exits 0. Timeouts are hang guards only. Every process it starts is killed on
# exit. Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."

TBON="${TBON:-${CARGO_TARGET_DIR:-target}/release/tbon}"
SIZES="${LAUNCHERS_SIZES:-8 32}"
GUARD_S=120 # hang guard for each wait below

if [[ ! -x "$TBON" ]]; then
    cargo build --release --bin tbon
fi
TBON="$(cd "$(dirname "$TBON")" && pwd)/$(basename "$TBON")"

if ! command -v mpirun >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        echo "== launchers: installing openmpi-bin"
        apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin >/dev/null
    fi
fi
if ! command -v mpirun >/dev/null 2>&1; then
    echo "== launchers: SKIP: mpirun is not installed and apt-get is unavailable (or not root)"
    exit 0
fi
MPIRUN=(mpirun --oversubscribe)
if [[ "$(id -u)" == 0 ]]; then
    MPIRUN+=(--allow-run-as-root)
fi
echo "== launchers: $(mpirun --version 2>&1 | head -1)"
LABEL=launchers
# shellcheck source=.ci/launch-common.sh
source "$(dirname "$0")/launch-common.sh"


for n in $SIZES; do
    run "mpirun -np $n" "$n" - -- "${MPIRUN[@]}" -np "$n"
done
# Radix 2 here: a deep tree, where most daemons hear of the shutdown through a relay.
for n in $SIZES; do
    run "mpirun -np $n, PMIX_RANK + TBON_SIZE only, radix 2" "$n" - -- \
        "${MPIRUN[@]}" -np "$n" -x PMIX_ONLY=1 -x TBON_SIZE="$n" -x TBON_RADIX=2
done
# One daemon dies: with --enable-recovery mpirun keeps the others, and tbon repairs its tree.
# (Without it, Open MPI 4.1 aborts the whole job; see the README.)
run "mpirun --enable-recovery -np 8, rank 5 SIGKILLed" 8 5 -- "${MPIRUN[@]}" --enable-recovery -np 8
echo "== launchers: all ok"
