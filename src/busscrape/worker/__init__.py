"""The worker daemon: renders tasks from TASKS in isolated browser tabs and publishes results.
"""
