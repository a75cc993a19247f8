"""The ingester daemon: results from RESULTS into the archive, and every dead letter beside them.

``daemon``: the ``Ingester`` (one result's way from RESULTS to the archive and its ack);
``archiver``: writing one result's folder; ``letters``: the ``Archivist``, its companion on
DEADLETTER.
"""
