"""Moved to ``analyzer.job.fsdp`` (the measured FSDP steps are facts the rules read, issue 40);
this name stays for code written against the old path while the parallel branches merge."""

from analyzer.job.fsdp import (ASPECT_RATIO, FsdpStep, fsdp_steps, group_of_kind, layer_count,  # noqa: F401
                               parameter_count, unit_links)
