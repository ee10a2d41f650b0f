"""Diagnosis rules (installed as ``analyzer.rules``): one module per rule; importing the package
registers them all. See ``analyzer.rules.engine`` for the rule contract."""

from analyzer.rules import (  # noqa: F401  (each module registers its rule)
    ddp_bucket_oversized,
    ddp_bucket_undersized,
    comm_bound_step,
    straggler_rank,
    fp32_gradient_comm,
    fsdp_missing_wrap_policy,
    fsdp_no_prefetch,
    fsdp_fullshard_cross_node,
    fsdp_where_ddp_fits,
    gpu_idle_host_bound,
    tp_cross_node,
    pipeline_bubble,
    ep_alltoall_exposed,
)
from analyzer.rules.engine import RULES, Rule, all_rules, run_rules

__all__ = ["RULES", "Rule", "all_rules", "run_rules"]
