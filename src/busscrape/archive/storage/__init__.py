"""Where the archive is written: the ``Storage`` interface (``base``) and its backends, a local
folder (``local``) and S3 (``s3``). ``open_storage`` picks one from the settings; the interface
imports no backend.
"""
