"""NATS JetStream: the connection, pipelined publishing, the pull-consumer base every daemon
builds on, the names of every stream, subject and id, and provisioning of ``streams/``.
"""
