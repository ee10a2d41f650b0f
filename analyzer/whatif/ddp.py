"""Moved to ``analyzer.job.ddp`` (the measured DDP steps are facts the rules read, issue 40);
this name stays for code written against the old path while the parallel branches merge."""

from analyzer.job.ddp import (DdpStep, MAX_GRADIENT_PIECES, allreduce_equation, backward_transfer_us,  # noqa: F401
                              bucket_ready_array, bucket_ready_times, ddp_steps, gradient_pieces, interpolate_ready,
                              interpolate_ready_array, link_origin, rebucket, representative, typical_step,
                              why_no_ddp_steps)
