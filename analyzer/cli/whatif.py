"""``tracecliff whatif``: project the measured job onto another configuration. The measured
job's options are the ones every command has (--gpu, --gpus-per-node, --nics-per-node, ...);
the projected job's are named --target-... (besides --gpus, --nodes, --strategy, --bucket-mb)."""

from __future__ import annotations

import click

from analyzer.base.limits import MAX_FSDP_UNITS
from analyzer.cli.options import COUNT, GBPS, config_option, emit, output_option, trace_options
from analyzer.whatif.projection import STRATEGY_CHOICES


@click.command("whatif")
@click.argument("paths", nargs=-1, required=True)
@click.option("--gpus", type=COUNT, help="Total GPUs of the projected job.")
@click.option("--nodes", type=COUNT, help="Nodes of the projected job.")
@click.option("--target-gpus-per-node", type=COUNT, help="GPUs per node of the projected job.")
@click.option("--target-nics-per-node", type=COUNT, help="NICs per node of the projected job.")
@click.option("--target-nic-gbps", type=GBPS,
              help="Projected NIC's achievable one-way GB/s (e.g. 45 for 400 Gb/s).")
@click.option("--strategy", type=click.Choice(STRATEGY_CHOICES), help="Projected data-parallel strategy.")
@click.option("--bucket-mb", type=click.FloatRange(min=0, min_open=True, max=1 << 20),
              help="Projected DDP bucket_cap_mb.")
@click.option("--fsdp-units", type=click.IntRange(min=1, max=MAX_FSDP_UNITS),
              help="Projected FSDP units of equal size, e.g. one per transformer block (a wrap policy).")
@click.option("--strong-scaling", is_flag=True,
              help="Keep the global batch: each GPU's work scales by measured / projected GPUs, its compute at the "
                   "efficiency the job measures per GEMM size (default: weak scaling, compute as measured).")
@click.option("--fix-ranks", type=click.STRING, metavar="R[,R...]",
              help="Replay the measured job with these ranks' causes fixed (as straggler-rank names them): the "
                   "figures its finding prints (each rank alone, and the ranks it names together).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@output_option
@trace_options
@config_option
def whatif_command(paths, gpus, nodes, target_gpus_per_node, target_nics_per_node, target_nic_gbps,
                   strategy, bucket_mb, fsdp_units, strong_scaling, fix_ranks, fmt, output, options, config,
                   config_path) -> None:
    """Project step time, exposed communication, scaling efficiency and MFU of the job in the
    traces at PATHS (or a saved JSON result) onto another configuration (no option: its own)."""
    from analyzer.api import load_run
    from analyzer.reports.whatif_text import render_text
    from analyzer.whatif.prediction import whatif_doc
    from analyzer.whatif.projection import Scenario
    result = load_run(list(paths), options, config, report=False)  # no report sections: only the projection
    if fix_ranks is not None:
        from analyzer.api import replay_fix_ranks
        from analyzer.reports.whatif_text import render_replay_text
        doc = replay_fix_ranks(result, fix_ranks)
        emit(_rendered(doc, fmt, render_replay_text), output, [i["path"] for i in result.inputs])
        return
    scenario = Scenario(gpus=gpus, nodes=nodes, gpus_per_node=target_gpus_per_node,
                        nics_per_node=target_nics_per_node, nic_gbps=target_nic_gbps, strategy=strategy,
                        bucket_mb=bucket_mb, fsdp_units=fsdp_units, model_params=options.model_params,
                        tokens_per_step=options.tokens_per_step, trace_nics_per_node=options.nics_per_node,
                        strong_scaling=strong_scaling)
    doc = whatif_doc(result, scenario)
    emit(_rendered(doc, fmt, render_text), output, [i["path"] for i in result.inputs])


def _rendered(doc, fmt: str, text) -> str:
    """The document as JSON, the text view (``text``) or the HTML page (reports/whatif_html.py)."""
    if fmt == "json":
        from analyzer.job.result import dumps
        return dumps(doc)
    if fmt == "html":
        from analyzer.reports.whatif_html import render_html
        return render_html(doc)
    return text(doc)
