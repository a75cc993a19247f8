"""What a run or a crawl produced, page by page, as it lands: ``Page`` (one archived page or dead
task, read back from the archive), ``PageFeed`` (the pages of a run in the order their outcome
was recorded, each once) and ``DatasetWriter`` (``-o FILE``: one row per page, JSONL, CSV or
Parquet).
"""
