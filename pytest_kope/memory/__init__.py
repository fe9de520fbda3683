"""The experience graph: everything tried, seen and learned, in SQLite; recall packs what matters.

- schema.py: tables, views and FTS5 indexes as ordered migrations
- scope.py: hardware identity and how close two operators / machines are
- graph.py: `Graph`, the store: recording attempts whole (one transaction each), runs, LLM calls,
  queries; it calls none of the modules below, which take it
- observe.py: a verdict as observation rows (build log, failures, crash, timings, notes)
- lessons.py: distilling lessons from child-vs-parent comparisons, with a value that learns
- recall.py: `RecallQuery` -> `Recall`, ranked and packed into a count or token budget
- exchange.py: JSON Lines export and content-keyed import
"""

from .exchange import export_jsonl, import_jsonl
from .graph import Graph
from .lessons import distill
from .recall import Recall, RecalledLesson, RecallQuery, recall_from

__all__ = [
    "Graph",
    "Recall",
    "RecallQuery",
    "RecalledLesson",
    "distill",
    "export_jsonl",
    "import_jsonl",
    "recall_from",
]
