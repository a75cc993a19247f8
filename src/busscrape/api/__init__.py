"""The HTTP API (``busscrape api``): tasks in, task histories and search out.
"""
