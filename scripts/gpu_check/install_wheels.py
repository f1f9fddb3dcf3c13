"""Install, from a folder of wheels and without the network, the packages this Python lacks.

Usage: ``install_wheels.py WHEELS SITE``. A wheel whose distribution is already installed is left
out (the GPU machine's own torch, numpy, packaging... stay as they are), and so is one built for
another Python or platform (the folder holds the GPU machine's Python 3.12 wheels); the rest go
into SITE with ``pip --no-index --no-deps --target``, which the caller puts on ``PYTHONPATH``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename


def installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def main() -> None:
    wheels, site = Path(sys.argv[1]), Path(sys.argv[2])
    supported = set(sys_tags())
    missing = [w for w in sorted(wheels.glob("*.whl"))
               if not installed(w.name.split("-")[0]) and parse_wheel_filename(w.name)[3] & supported]
    print(f"wheels: {len(missing)} to install into {site}: {', '.join(w.name.split('-')[0] for w in missing)}",
          flush=True)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, missing)], check=True)


if __name__ == "__main__":
    main()
