"""Where pages may connect: address parsing, the network policy and the egress proxy that
enforces it, and TLS client contexts.
"""
