"""What a launch from here would do with no arguments: the settings actually in force.

A config file's ``distributed_type: NO`` / ``use_cpu: false`` mean "let the launcher
detect"; reports should say what it detects (2 CPU workers is ``MULTI_CPU``).
"""

from __future__ import annotations

import os

from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.machine.launch_kinds import device_launch


def launch_in_force(config_file: str | os.PathLike | None = None) -> str:
    """One line: processes, device, the Accelerate ``distributed_type`` equivalent, start
    method and mixed precision of ``notebook_launcher(fn)`` called here now.

    Raises:
        ValueError: the config file or environment holds a bad value (named).
    """
    plan = make_plan(**fill_options({}, config_file))
    kind = device_launch(plan.device_type).recorded_type(plan.world_size)
    return (f"A launch here: {plan.num_processes} process(es) on {plan.device_type} "
            f"(distributed_type {kind}, use_cpu {str(plan.device_type == 'cpu').lower()}), "
            f"start method {plan.start.method}, mixed precision {plan.mixed_precision}")
