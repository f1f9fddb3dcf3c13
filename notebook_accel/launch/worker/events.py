"""The old path of the worker-side event emitter, now :mod:`notebook_accel.events`.

The emitter runs in the runtime (``progress``, ``tracking``), which never imports
``launch/``, so it lives beside the wire protocol. This path stays for code that
imports it (``from notebook_accel.launch.worker import events``): it is the same
module object, so patching either name patches both.
"""

import sys

from notebook_accel import events

sys.modules[__name__] = events
