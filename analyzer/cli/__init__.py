"""Every Click command and shared option; nothing outside this package imports Click."""

import os

# numpy asks the kernel for transparent huge pages on every array of 4 MB or more (madvise,
# checked when numpy is imported). Where the kernel compacts memory to find one at the fault
# (defrag "madvise", a common default), the reduce of a large job spent a third of its CPU in
# those faults: 1,024 ranks x 2,000 collectives, 9.4 s of system time and 21 s of CPU, against
# 3.1 s and 14 s without (docs/scale.md, issue 42). The command's own default; a user's
# NUMPY_MADVISE_HUGEPAGE=1 keeps huge pages, and the library API leaves numpy as it finds it.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

from analyzer.cli.main import cli, console, main

__all__ = ["cli", "console", "main"]
