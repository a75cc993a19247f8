"""Dead letters: filing a give-up into DEADLETTER (``filing``) and the operator's queue over it
(``queue``: ``busscrape dlq``).
"""
