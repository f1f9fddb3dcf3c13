"""Install, from a folder of wheels and without the network, the packages this Python lacks.

Usage: ``install_wheels.py WHEELS SITE``. A wheel whose distribution is already installed is left
out (the GPU machine's own torch, numpy, packaging... stay as they are); the rest go into SITE
with ``pip --no-index --no-deps --target``, which the caller puts on ``PYTHONPATH``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path


def installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def main() -> None:
    wheels, site = Path(sys.argv[1]), Path(sys.argv[2])
    missing = [w for w in sorted(wheels.glob("*.whl")) if not installed(w.name.split("-")[0])]
    print(f"wheels: {len(missing)} to install into {site}: {', '.join(w.name.split('-')[0] for w in missing)}",
          flush=True)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, missing)], check=True)


if __name__ == "__main__":
    main()
