"""gradflowrun, the job launcher: launch.py (validation, launcher
choice, command line), command_line.py (the argument parser), hosts.py (host lists), rank_wrapper.py (per-rank output and exit
status), check_build.py; run_func.py / run_task.py: `run`, Horovod's
`horovod.run` (a Python function on N new ranks, their return values back).
Console script: gradflow.runner.launch:main.
Importing this package must not need torch, tensorflow or the native module.
"""
from .run_func import run  # noqa: F401
