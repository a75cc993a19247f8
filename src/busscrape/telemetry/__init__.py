"""Logs, metrics, traces and the daemons' health endpoints.
"""
