"""The permanent archive: how a result's files are laid out (``layout``) and where they are
written (``storage``: a local folder or S3).
"""
