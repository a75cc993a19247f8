"""The dispatcher: input lines in, validated, normalised and de-duplicated tasks into TASKS.
"""
