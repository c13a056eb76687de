"""Pagination of the API's lists."""

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """limit/offset within what the database can take: limit at most 1000, offset at most
    2^62 (PostgreSQL's bigint); a negative or malformed value is the default."""

    max_limit = 1000
    max_offset = 2**62

    def get_offset(self, request):
        return min(super().get_offset(request), self.max_offset)
