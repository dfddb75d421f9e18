"""gradflowrun, the job launcher: launch.py (validation, launcher
choice, command line), command_line.py (the argument parser), hosts.py (host lists), rank_wrapper.py (per-rank output and exit
status), check_build.py. Console script: gradflow.runner.launch:main.
Importing this package must not need torch, tensorflow or the native module.
"""
