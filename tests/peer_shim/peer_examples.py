"""The peer's ``examples/by_feature`` scripts on 2 processes against notebook_accel (kernel side).

The scripts are not in the peer's wheel or sdist, only in its git repository:
``NOTEBOOK_ACCEL_PEER_REPO`` (a checkout or a bare git directory), else a mirror at one of
``DEFAULT_REPOS``. They are copied at run time (never committed) and run on 2 processes
(our ``notebook_launcher``, or ``notebook-accel launch``: see ``run_example``) through
``run_peer_example.py``, which replaces their data loading only. Usage:
``python tests/peer_shim/peer_examples.py [NAME...]`` prints each script's exit status and
metric lines.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
if __package__ in (None, ""):
    sys.path.insert(0, str(HERE.parent.parent))
from tests.peer_shim import run_all  # noqa: E402

RUNNER = HERE / "run_peer_example.py"
MIRROR = ".mirror/huggingface+accelerate/repo"  # where a fetched mirror lies, beside the checkout
DEFAULT_REPOS = (HERE.parents[2] / MIRROR, Path("/work") / MIRROR)
FOLDERS = ("examples/by_feature", "examples/deepspeed_config_templates")
EPOCH = r"epoch \d+: \{'accuracy': [\d.]+, 'f1': [\d.]+\}"  # the GLUE examples' accelerator.print


@dataclass(frozen=True)
class Example:
    """How one example runs (its arguments, extra environment, launch config) and what it must do:
    print ``prints`` (the first ``repeats`` times: once per epoch, from rank 0 only) and write
    ``files`` (globs in its run folder). ``needs``: the packages it imports beyond the usual."""

    args: tuple[str, ...] = ("--cpu",)
    env: dict[str, str] = field(default_factory=dict)
    prints: tuple[str, ...] = (EPOCH,)
    repeats: int = 3  # the examples' config: 3 epochs
    files: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # packages beyond datasets and transformers
    config_file: str = ""  # a launch config (the peer's format): started by `notebook-accel launch`

    def missing(self) -> list[str]:
        """The packages this example needs that are not installed."""
        return [p for p in ("datasets", "transformers", "tokenizers", *self.needs)
                if importlib.util.find_spec(p) is None]


# What `accelerate config` writes for DeepSpeed with a JSON file (the peer's README for this example).
DEEPSPEED_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: {work}/zero_stage2_cpu.json
  zero3_init_flag: false
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""

EXAMPLES = {
    "automatic_gradient_accumulation": Example(),
    "checkpointing": Example(("--cpu", "--checkpointing_steps", "epoch", "--output_dir", "{out}"),
                             files=("epoch_0/model.*", "epoch_1/optimizer.*", "epoch_2/random_states_1.*")),
    "cross_validation": Example(prints=(EPOCH, r"Average test metrics from all folds: \{'accuracy'"),
                                repeats=9, needs=("sklearn",)),  # 3 folds
    "ddp_comm_hook": Example(("--cpu", "--ddp_comm_hook", "power_sgd")),
    "early_stopping": Example(),
    "gradient_accumulation": Example(("--cpu", "--gradient_accumulation_steps", "2")),
    "gradient_accumulation_for_autoregressive_models": Example(
        ("--cpu", "--gradient_accumulation_steps", "2", "--per_device_batch_size", "8"),
        prints=(r"epoch 0 - update step 0:: grad norm: [\d.]+ ::train loss: [\d.]+",
                r"epoch 2:: eval perplexity: [\d.]+ eval_loss: [\d.]+"), repeats=1),
    "local_sgd": Example(("--cpu", "--local_sgd_steps", "2")),
    "memory": Example(),
    "multi_process_metrics": Example(),
    "profiler": Example(("--cpu", "--record_shapes", "--output_trace_dir", "{out}/traces"),
                        prints=(EPOCH, r"Self CPU time total"),
                        files=("traces/profile_0.json", "traces/profile_1.json")),
    "schedule_free": Example(needs=("schedulefree",)),
    "tracking": Example(("--cpu", "--with_tracking", "--project_dir", "{out}/logs"),
                        env={"WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": "file://{out}/mlruns",
                             "MLFLOW_ALLOW_FILE_STORE": "true"},
                        files=("logs/tracking/metrics.jsonl", "wandb/offline-run-*/run-*.wandb",
                               "mlruns/*/*/metrics/f1")),
    "fsdp_with_peak_mem_tracking": Example(
        ("--model_name_or_path", "bert-base-cased"),
        prints=(EPOCH, r"(?m)^(\[rank 0\] )?DistributedType\.FSDP$",
                r"Peak Memory consumed during the train \(max-begin\): \d+")),
    "deepspeed_with_config_support": Example(
        ("--dataset_name", "Salesforce/wikitext", "--dataset_config_name", "wikitext-2-raw-v1",
         "--model_name_or_path", "gpt2", "--block_size", "16", "--per_device_train_batch_size", "16",
         "--per_device_eval_batch_size", "16", "--num_train_epochs", "2", "--output_dir", "{out}/model",
         # the script's own check: the best epoch's metric again after load_state(best_checkpoint).
         # Without this flag it evaluates the last epoch's weights and fails whenever epoch 0 was best
         # (the peer's own tests leave this script out).
         "--load_best_model"),
        config_file=DEEPSPEED_CONFIG,
        prints=(r"New best metric: [\d.]+ at epoch 0", r"Best model metrics: perplexity: [\d.]+"), repeats=1,
        # DeepSpeed's own checkpoint, its optimizer state in one ZeRO shard per rank
        files=("model/all_results.json", "model/model.safetensors",
               "model/best_checkpoint/pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
        needs=("deepspeed",)),
}


def peer_repo() -> Path | None:
    """The peer's repository: ``$NOTEBOOK_ACCEL_PEER_REPO``, else a mirror of ``DEFAULT_REPOS``; None when none exists."""
    given = os.environ.get("NOTEBOOK_ACCEL_PEER_REPO")
    return next((path for path in (Path(given) if given else None, *DEFAULT_REPOS) if path and path.exists()), None)


def missing_reason() -> str:
    given = os.environ.get("NOTEBOOK_ACCEL_PEER_REPO")
    return (f"the peer's examples/by_feature scripts are only in its git repository: neither "
            f"NOTEBOOK_ACCEL_PEER_REPO ({given or 'unset'}) nor {' nor '.join(map(str, DEFAULT_REPOS))} exists "
            "(git clone https://github.com/huggingface/accelerate and point NOTEBOOK_ACCEL_PEER_REPO at it)")


def copy_examples(repo: Path, dest: Path) -> None:
    """Copy ``FOLDERS`` from ``repo`` (a checkout: its files; a git directory: HEAD) into ``dest``,
    and write the CPU DeepSpeed config beside them."""
    if (repo / FOLDERS[0]).is_dir():
        for folder in FOLDERS:
            shutil.copytree(repo / folder, dest / folder, dirs_exist_ok=True)
    else:
        archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", "HEAD", *FOLDERS],
                                 capture_output=True, check=True, timeout=60).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    write_cpu_deepspeed_config(dest)


def write_cpu_deepspeed_config(work: Path) -> None:
    """``work/zero_stage2_cpu.json``: the peer's ZeRO-2 template without what we do not run here.

    Its ``fp16`` is turned off (DeepSpeed's CPU accelerator has no fp16); its ``optimizer`` and
    ``scheduler`` sections are removed (we do not support DeepSpeed's own optimizer and
    scheduler: the script then makes a torch AdamW and a transformers scheduler, its other path).
    """
    template = work / "examples" / "deepspeed_config_templates" / "zero_stage2_config.json"
    config = json.loads(template.read_text())
    config["fp16"]["enabled"] = False
    del config["optimizer"], config["scheduler"]
    (work / "zero_stage2_cpu.json").write_text(json.dumps(config, indent=1))


def run_example(name: str, work: Path, timeout: float = 240, extra: tuple[str, ...] = (),
                run: str | None = None) -> dict:
    """Run example ``name`` (copied into ``work``) on 2 processes, in the folder ``work/runs/<run>``
    (default: ``name``), with ``extra`` arguments after its own.

    With a ``config_file``, by ``notebook-accel launch --config-file`` (``accelerate launch
    --config_file``'s equivalent), else through our ``notebook_launcher`` in a process that
    imported the examples' libraries once: its forked workers inherit them (half the CPU time
    of workers importing their own).

    Returns ``{"returncode", "output", "ranks": [each rank's report]}``; leaves no process behind.
    """
    example = EXAMPLES[name]
    out = work / "runs" / (run or name)
    out.mkdir(parents=True, exist_ok=True)
    fill = {"out": str(out), "work": str(work)}
    script = work / "examples" / "by_feature" / f"{name}.py"
    if example.config_file:
        config = out / "launch_config.yaml"
        config.write_text(example.config_file.format(**fill))
        start = ["-m", "notebook_accel", "launch", "--config-file", str(config), str(RUNNER)]
    else:
        start = [str(RUNNER), "--launcher"]
    cmd = [sys.executable, *start, str(out), str(script), *(arg.format(**fill) for arg in (*example.args, *extra))]
    env = run_all._env(**{k: v.format(**fill) for k, v in example.env.items()})
    code, output = run_all._run(cmd, out, env, timeout)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob(f"{name}_rank*.json"))]
    return {"returncode": code, "output": output, "ranks": ranks}


def failure(result: dict) -> str:
    """The failed ranks' tracebacks (from their reports), else the end of the output."""
    errors = [f"rank {r['rank']}: {r['error']}" for r in result["ranks"] if r.get("error")]
    return "\n".join(errors) or result["output"][-6000:]


def main() -> int:
    repo = peer_repo()
    if repo is None:
        print(missing_reason())
        return 1
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="peer_examples_"))
    copy_examples(repo, work)
    bad = 0
    for name in sys.argv[1:] or EXAMPLES:
        result = run_example(name, work)
        lines = [line for line in result["output"].splitlines() if "epoch" in line or "metric" in line]
        print(f"== {name}: exit {result['returncode']}\n" + "\n".join(lines[-6:]))
        if result["returncode"] != 0:
            print(failure(result))
            bad += 1
    print(f"(runs in {work})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
