"""Count, at one or more revisions, what issue 20's and 32's seams were built to remove: strategy
special cases outside the strategies, places that spell launch options or their choices, wire
message kinds spelled as bare strings. Each count is a regular expression over the engine and front-end
sources (``git grep``, tests excluded), so any commit can be measured the same way.

Usage, from a checkout: ``python scripts/seam_counts.py 8877f8f HEAD``.
"""

from __future__ import annotations

import subprocess
import sys

SOURCES = ["notebook_accel", "magics"]
# where each strategy's own code lives, before (fsdp/, deepspeed_zero/, xla/) and after (strategies/)
STRATEGY_HOMES = ("notebook_accel/strategies/", "notebook_accel/fsdp/", "notebook_accel/deepspeed_zero/",
                  "notebook_accel/xla/")
_CHOICE = r'"(no|fp16|bf16|fp8)"'
# name -> (pattern, sources, excluded paths)
COUNTS = {
    "strategy special cases outside the strategies":
        (r'distributed_type\s*[!=]=|DistributedType\.(FSDP|DEEPSPEED|XLA)|is_xla\(|_uses_xla|'
         r'isinstance\([^)]*(Fsdp|FSDP|DeepSpeed|Zero)', SOURCES, STRATEGY_HOMES),
    "lists of the mixed-precision choices (two or more together)":
        (rf'[(\[{{]\s*{_CHOICE}\s*,\s*{_CHOICE}|{_CHOICE}\s*:\s*torch\.', SOURCES,
         ("notebook_accel/contract.py",)),
    "lists of the device choices":
        (r'"cpu", "cuda"|"cuda", "cpu"|\("cpu", "cuda", "xla"\)', SOURCES, ("notebook_accel/contract.py",)),
    "option names spelled as flags or keys (mixed_precision)":
        (r'"--mixed[-_]precision"|"mixed_precision":|\("mixed_precision"', SOURCES,
         ("notebook_accel/contract.py",)),
    # issue 32: an option named once. Every line naming the option outside its row: the plumbing
    # (signatures, keyword lists, flag lists) and what it does (the plan's field, its user)
    "lines naming a launch option outside its row (hang_after)":
        (r'hang[_-]after', SOURCES, ("notebook_accel/contract.py",)),
    "lines naming a launch option outside its row (dynamo_backend)":
        (r'dynamo[_-]backend', SOURCES, ("notebook_accel/contract.py",)),
    "wire message kinds as bare strings (engine)":
        (r'kind\s*==\s*"|\(\s*"(ok|error|display|metrics|progress|memory|dropped)"\s*,', ["notebook_accel"],
         ("notebook_accel/wire.py",)),
}


def count(revision: str, pattern: str, sources: list[str], excluded: tuple[str, ...]) -> tuple[int, int]:
    """(matching lines, files) of ``pattern`` in ``sources`` at ``revision``, outside ``excluded``."""
    found = subprocess.run(["git", "grep", "-n", "-E", pattern, revision, "--", *sources],
                           capture_output=True, text=True).stdout.splitlines()
    paths = [line.split(":", 2)[1] for line in found]
    kept = [p for p in paths if not p.startswith(excluded)]
    return len(kept), len(set(kept))


def main(revisions: list[str]) -> None:
    revisions = revisions or ["HEAD"]
    print(f"{'':64s}" + "".join(f"{r:>18s}" for r in revisions))
    for name, (pattern, sources, excluded) in COUNTS.items():
        cells = [count(r, pattern, sources, excluded) for r in revisions]
        print(f"{name:64s}" + "".join(f"{f'{n} in {f} files':>18s}" for n, f in cells))


if __name__ == "__main__":
    main(sys.argv[1:])
