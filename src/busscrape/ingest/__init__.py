"""The ingester daemon: results from RESULTS into the archive, and every dead letter beside them.
"""
