"""Test helpers that stand up real things on loopback: S3 servers, sites, TCP proxies, processes."""
