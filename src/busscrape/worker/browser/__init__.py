"""The browser side of a worker: Chromium found and launched (``chromium``), a pool of reusable,
wiped tabs (``pool``, ``tabs``).
"""
