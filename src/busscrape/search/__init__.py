"""Full-text search over archived pages: the index interface and its SQLite and PostgreSQL
backends, and the feed that fills it from the ingester.
"""
