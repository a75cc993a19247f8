"""The ARTIFACTS object store: page bytes in transit between worker and ingester (claim checks),
and the clean-up of what killed attempts leave behind.
"""
