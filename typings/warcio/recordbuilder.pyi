from typing import IO, Any

from warcio.statusandheaders import StatusAndHeaders

class ArcWarcRecord:
    rec_type: str
    rec_headers: StatusAndHeaders
    http_headers: StatusAndHeaders | None
    raw_stream: IO[bytes]
    length: int | None

class RecordBuilder:
    WARC_1_0: str
    WARC_1_1: str
    warc_version: str
    def __init__(self, warc_version: str | None = None, header_filter: Any = None) -> None: ...
    def create_warcinfo_record(self, filename: str, info: dict[str, Any]) -> ArcWarcRecord: ...
    def create_revisit_record(self, uri: str, digest: str, refers_to_uri: str, refers_to_date: str,
                              http_headers: StatusAndHeaders | None = None,
                              warc_headers_dict: dict[str, str] | None = None) -> ArcWarcRecord: ...
    def create_warc_record(self, uri: str, record_type: str, payload: IO[bytes] | None = None,
                           length: int | None = None, warc_content_type: str = "",
                           warc_headers_dict: dict[str, str] | None = None,
                           warc_headers: StatusAndHeaders | None = None,
                           http_headers: StatusAndHeaders | None = None) -> ArcWarcRecord: ...
    def ensure_digest(self, record: ArcWarcRecord, block: bool = True, payload: bool = True) -> None: ...
