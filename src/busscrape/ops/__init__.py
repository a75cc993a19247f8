"""Running busscrape: ``busscrape run`` (the embedded default), its supervisor of local daemons,
the embedded nats-server, the operator's overview (``busscrape status``) and the demo site.
"""
