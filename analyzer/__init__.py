"""tracecliff: explain distributed-training scaling cliffs from PyTorch profiler traces.

Data flows one way: ``ingest`` (files -> RankTrace) -> analyses (``timeline``, ``comms``, ...)
-> ``Result`` -> ``rules`` (findings) -> ``reports`` (text, json, html).
"""

__version__ = "0.1.0"
