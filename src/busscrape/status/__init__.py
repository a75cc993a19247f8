"""What became of each task: the STATUS records services write (``records``), a task's merged
history (``history``) and the run's watcher (``tracker``).
"""
