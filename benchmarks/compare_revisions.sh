#!/usr/bin/env bash
# Run the same benchmarks on two revisions, alternating, in one run: a refactor must not make a
# measured figure worse. Each revision runs its own benchmark scripts against its own code
# (PYTHONPATH), in a throwaway worktree for BEFORE; AFTER defaults to this checkout as it is.
#
#   bash benchmarks/compare_revisions.sh BEFORE [AFTER] [-- benchmark.py args...]
#   e.g. bash benchmarks/compare_revisions.sh 8877f8f
#
# BENCHMARKS (environment) overrides the list, ';'-separated; a leading "torchrun" runs that
# benchmark under torchrun with 2 processes: "launch_latency.py --no-spawn;torchrun step_overhead.py".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
before=${1:?usage: compare_revisions.sh BEFORE [AFTER]}
after=${2:-}
python=${PYTHON:-$PWD/.venv/bin/python}
IFS=';' read -r -a benchmarks <<< "${BENCHMARKS:-launch_latency.py --no-spawn;torchrun step_overhead.py;event_overhead.py --rounds 9}"
work=$(mktemp -d)
trap 'for t in "$work"/*/; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/before" "$before"
after_dir=$PWD
if [ -n "$after" ]; then git worktree add -q --detach "$work/after" "$after"; after_dir=$work/after; fi
for bench in "${benchmarks[@]}"; do
    read -r -a words <<< "$bench"
    runner=("$python")
    if [ "${words[0]}" = torchrun ]; then
        runner=(env ACCELERATE_USE_CPU=yes OMP_NUM_THREADS=1 "$python" -m torch.distributed.run --nproc-per-node 2)
        words=("${words[@]:1}")
    fi
    for side in before after; do
        dir=$work/before; [ "$side" = after ] && dir=$after_dir
        echo "=== $side ($(git -C "$dir" describe --always --dirty)): ${words[*]}"
        (cd "$dir" && PYTHONPATH="$dir" "${runner[@]}" "benchmarks/${words[0]}" "${words[@]:1}" 2>&1 | grep -v "^\[20.*WARNING" || true)
    done
done
