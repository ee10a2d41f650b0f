"""The evidence fields several rules write, declared once: the same figure keeps one label and one
unit in every rule's evidence type (analyzer.rules.evidence_types) and so in every view. A rule
types its field with the name here (``step_time_us: TypicalStep``); a field only one rule writes
is declared in that rule's own type. Types only: no analysis."""

from __future__ import annotations

from typing import Annotated, Any

from analyzer.rules.evidence_types import (AlphaBetaLink, Bytes, Count, FixMemory, Mb, RankStepRef, Share, Text, Us,
                                           columns, label)

# the step and what the fix makes of it
TypicalStep = Annotated[Us, label("typical step")]
PredictedStep = Annotated[Us, label("predicted step")]
ProjectedBy = Annotated[Text, label("projected by")]
# a rule's own prediction (analyzer.job.prediction_doc's document; reports/prediction.py draws it)
Prediction = dict[str, Any]
StepTimeOfThoseRanks = Annotated[Us, label("step time (median of those ranks)")]
MemoryAfterFix = Annotated[FixMemory, label("memory after the fix")]
# where a figure is taken from
RankNumber = Annotated[Count, label("rank")]
StepNumber = Annotated[Count, label("step")]
Representative = Annotated[RankStepRef, label("representative rank and step")]
Collectives = Annotated[Text, label("collectives")]
Cause = Annotated[Text, label("cause")]
WaitSource = Annotated[Text, label("waiting measured by")]
ExposedShare = Annotated[Share, label("exposed share of the step")]
# the job and its links
Link = Annotated[AlphaBetaLink, label("link (α-β)")]
SStar = Annotated[Bytes, label("S* = α·β (latency-bandwidth crossover)")]
Nodes = Annotated[Count, label("nodes")]
DeviceMemory = Annotated[Bytes, label("device memory")]
GpuMemory = Annotated[Bytes, label("GPU memory")]
Parameters = Annotated[Count, label("parameters")]
ParametersFrom = Annotated[Text, label("parameters from")]
UnitsPerForward = Annotated[Count, label("FSDP units per forward pass")]
CommTime = Annotated[Us, label("communication time")]
# the DDP bucket rules' model of the tail after backward
BucketCount = Annotated[Count, label("buckets")]
FirstBucketWait = Annotated[Us, label("first bucket's wait")]
ModelledTail = Annotated[Us, label("modelled tail")]
SuggestedCapMb = Annotated[Mb, label("suggested bucket_cap_mb")]
TailByCapMb = Annotated[list[list[Count]], label("modelled tail by bucket cap"),
                        columns(("bucket cap", "mb"), ("modelled tail", "us"))]
