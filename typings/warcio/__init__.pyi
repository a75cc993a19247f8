# warcio ships no type information; these stubs type what busscrape uses of it (worker/warc.py).
