"""The launch configuration: a YAML file in the format of Accelerate's ``default_config.yaml``.

A file written by ``accelerate config`` loads as is; keys we do not use are kept
when the file is saved again and reported once. Where the file lives:

1. ``$NOTEBOOK_ACCEL_CONFIG_FILE`` if set;
2. else ``$XDG_CACHE_HOME/notebook_accel/default_config.yaml`` (``~/.cache/...``);
   when that file is missing, the peer's ``$HF_HOME/accelerate/default_config.yaml``
   (``~/.cache/huggingface/...``) is read instead, if present.

Precedence for a launch (:func:`resolve_launch_options`): explicit argument >
environment (``NOTEBOOK_ACCEL_*``) > config file > auto-detection (the launcher's job).
"""

from notebook_accel.config.files import (
    CONFIG_FILE_ENV,
    default_config_path,
    find_config_file,
    load_config,
    peer_config_path,
    save_config,
)
from notebook_accel.config.resolve import (
    ENV_OPTIONS,
    detect_default_config,
    device_to_save,
    resolve_launch_options,
)
from notebook_accel.config.schema import (
    DEVICE_TYPES,
    DISTRIBUTED_TYPES,
    MIXED_PRECISIONS,
    LaunchConfig,
)
from notebook_accel.contract import START_METHODS

__all__ = [
    "CONFIG_FILE_ENV", "DEVICE_TYPES", "DISTRIBUTED_TYPES", "ENV_OPTIONS", "MIXED_PRECISIONS",
    "START_METHODS", "LaunchConfig", "default_config_path", "detect_default_config", "device_to_save",
    "find_config_file", "load_config", "peer_config_path", "resolve_launch_options",
    "save_config",
]
