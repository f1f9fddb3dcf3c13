"""An import that initialises CUDA in the kernel before the first launch (torchao and numa do on
Kaggle; Accelerate's notebook_launcher then fails): the launch still works, from the warm
forkserver, and says why (issue 31, part 7). No GPU here: the import is faked faithfully
(tests/kernel/fake_imports/initialises_cuda.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

FAKES = Path(__file__).parent / "fake_imports"

PROBE = textwrap.dedent("""
    def probe():
        import os
        import torch
        return int(os.environ["RANK"]), torch.cuda._is_in_bad_fork(), torch.cuda.is_initialized()
""")


def test_a_cuda_initialising_import_before_the_first_launch(fresh_kernel):
    k = fresh_kernel
    k.ok(f"import sys; sys.path.insert(0, {str(FAKES)!r})\n"
         "import initialises_cuda   # as `import torchao` on Kaggle\n"
         "import torch\nfrom notebook_accel import notebook_launcher\n" + PROBE)
    # the fake is what a real initialisation leaves: the kernel says so, a forked child is poisoned
    check = k.ok("import multiprocessing as mp\n"
                 "with mp.get_context('fork').Pool(1) as pool:\n"
                 "    print('kernel', torch.cuda.is_initialized(), 'forked child bad:',\n"
                 "          pool.apply(initialises_cuda.forked_child_is_bad_fork))")
    assert "kernel True forked child bad: True" in check.stdout

    result = k.ok("print('ranks', notebook_launcher(probe, num_processes=2, return_all=True))",
                  timeout=180)
    assert ("[notebook_accel] start method: forkserver (CUDA is initialised in this kernel, so "
            "workers start from a warm forkserver)") in result.stdout
    assert "ranks [(0, False, False), (1, False, False)]" in result.stdout  # clean workers

    refused = k.run("notebook_launcher(probe, num_processes=2, start_method='fork')")
    assert refused.error["ename"] == "ValueError"
    assert "start_method='fork' is unsafe here: CUDA is initialised in this kernel" in \
        refused.error["evalue"]
