"""activation-checkpointing-room (TC605)."""

from __future__ import annotations

from typing import Annotated

from analyzer.base.units import fmt_bytes, fmt_us
from analyzer.job.memory import fix_memory, measured_peak, not_checked, share_text
from analyzer.rules.evidence_types import Bytes, Count, Evidence, Share, Text, Us, inner, keys, label
from analyzer.rules.evidence_shared import DeviceMemory, MemoryAfterFix
from analyzer.rules.engine import NotApplicable, Rule, Threshold, register


class RecomputeStep(Evidence, frozen=True, forbid_unknown_fields=True):
    """A rank-step's forward ops re-run in backward (analyzer.rank.recompute)."""

    ops: Annotated[Count, label("ops")]
    gpu_us: Annotated[Us, label("GPU time")]
    host_us: Annotated[Us, label("host time")]


class CheckpointingFound(Evidence, frozen=True, forbid_unknown_fields=True):
    """``job.activation_checkpointing.evidence`` where it was detected (analyzer.job.memory), as handed on."""

    ranks: Annotated[list[Count], label("ranks")]
    forward_ops_in_backward: Annotated[Count, label("forward ops re-run in backward")]
    frames: Annotated[Count, label("checkpoint frames")]
    per_step: Annotated[dict[str, dict[str, RecomputeStep]], label("per step"), keys("rank"), inner("step")]


class CheckpointingRoomEvidence(Evidence, frozen=True, forbid_unknown_fields=True):
    recompute_us: Annotated[Us, label("recompute")]
    recompute_basis: Annotated[Text, label("recompute measured as")]
    peak_bytes: Annotated[Bytes, label("measured peak")]
    device_bytes: DeviceMemory
    room_fraction: Annotated[Share, label("peak share of the GPU below which memory is to spare")]
    checkpointing: Annotated[CheckpointingFound, label("activation checkpointing")]
    memory: MemoryAfterFix


@register
class ActivationCheckpointingRoom(Rule):
    """Activation checkpointing recomputes forward while the GPU has memory to spare.

    What it detects:
        Recompute (forward-only ops such as ``aten::linear`` or a forward attention kernel re-run
        inside backward, or ``CheckpointFunction`` frames: ``torch.utils.checkpoint``,
        ``checkpoint_wrapper``; ``job.activation_checkpointing``) in a job whose measured peak
        (allocator totals, ``profile_memory=True``) stays below ``room_fraction`` of the GPU.

    Why it matters:
        Checkpointing trades compute for memory: each checkpointed layer runs its forward twice
        (full recompute: ≈ +33% compute). With memory to spare the trade buys nothing: the
        recompute time is lost every step.

    Evidence:
        The recompute time per step (GPU time of the re-run forward ops), the measured peak and
        the device's memory, the forward ops seen in backward, and whether keeping the
        activations fits (``evidence.memory``: L·(34 − 2)·s·b·h more, from recorded shapes).

    Fix:
        Checkpoint fewer layers (``apply_activation_checkpointing`` with a ``check_fn`` that
        selects every k-th block), or none; or spend the memory on a larger micro-batch.

    References:
        docs/models.md §9; Korthikanti et al. 2022 (selective recomputation); Chen et al.,
        "Training Deep Nets with Sublinear Memory Cost", 2016.
    """

    name = "activation-checkpointing-room"
    code = "TC605"
    title = "Activation checkpointing only where memory needs it"
    failure_title = "Activation checkpointing recomputes forward with memory to spare"
    severity = "warning"
    thresholds = {
        "room_fraction": Threshold(0.5, "measured peak, as a fraction of the GPU, below which memory is to spare",
                                   0.0, 1.0),
    }
    recovers = ("compute_only_us",)
    fix_requires = ("training",)  # activation checkpointing trades backward recompute for memory
    Evidence = CheckpointingRoomEvidence
    references = ("docs/models.md §9", "Korthikanti et al., Reducing Activation Recomputation, 2022",
                  "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016")

    def check(self, ctx):
        checkpointing = ctx.result.job.get("activation_checkpointing") or {}
        if not checkpointing.get("detected"):
            raise NotApplicable("no recompute: no forward op re-run in backward, no checkpoint frame")
        memory = ctx.result.memory
        peak = measured_peak(memory)
        device = (memory or {}).get("device_bytes")
        if peak is None or not device:
            raise NotApplicable(not_checked(memory))
        if peak >= ctx.thresholds["room_fraction"] * device:
            return []
        recompute = checkpointing.get("recompute_us")
        added, source = self._kept_activations(memory)
        fit = fix_memory(ctx.facts, added, source=source)
        summary = (f"Recompute costs {fmt_us(recompute)} a step while memory peaks at "
                   f"{share_text(peak, device)}"
                   + (f"; keeping the activations adds about {fmt_bytes(added)}, and {fit['text']}" if added and
                      fit.get("text") else "") + ".")
        evidence = CheckpointingRoomEvidence(
            recompute_us=recompute, recompute_basis=checkpointing.get("basis"), peak_bytes=peak, device_bytes=device,
            room_fraction=ctx.thresholds["room_fraction"], checkpointing=checkpointing.get("evidence"), memory=fit)
        return [ctx.finding(summary=summary, ranks=sorted(checkpointing["evidence"]["ranks"]),
                            steps=[checkpointing["step"]] if checkpointing.get("step") is not None else [],
                            evidence=evidence, estimated_gain_us=recompute,
                            model="gain = the recompute time (forward ops re-run in backward); memory added = "
                                  "L·(34 − 2)·s·b·h (docs/models.md §9)",
                            fix_text="Checkpoint fewer blocks (every k-th, or none) and keep their activations: "
                                     "the memory is there.",
                            fix_snippet=("apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,\n"
                                         "    check_fn=lambda m: isinstance(m, Block) and m.index % 2 == 0)"))]

    @staticmethod
    def _kept_activations(memory):
        """The bytes keeping every checkpointed layer's activations adds: L·(34 − 2)·s·b·h, L the
        forward attention ops per step halved (each checkpointed layer runs its forward twice)."""
        activations = ((memory or {}).get("models") or {}).get("activations") or {}
        sbh, layers = activations.get("sbh"), activations.get("layers")
        if not sbh or not layers:
            return None, "no attention op with recorded shapes: s·b·h unknown"
        kept = max(1, layers // 2)
        return kept * (34 - 2) * sbh, (f"{kept} layer(s) × (34 − 2)·s·b·h, s·b·h = {sbh:,} from the attention shapes "
                                       "(every layer assumed checkpointed: its forward attention runs twice)")
