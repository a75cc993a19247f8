"""The messages on the bus (frozen pydantic models, one codec) and the step DSL a task carries.
"""
