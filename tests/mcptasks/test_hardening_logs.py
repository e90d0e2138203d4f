"""Client errors (4xx) are logged on one line, without a traceback; server errors keep theirs."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize(("status", "traceback_kept"), [(403, False), (400, False), (500, True)])
def test_django_request_records(status: int, traceback_kept: bool) -> None:
    keep = _Keep()
    logging.getLogger().addHandler(keep)
    try:
        try:
            raise PermissionDenied("no")
        except PermissionDenied as exc:
            log_response("Forbidden (Permission denied): %s", "/admin/x/", response=HttpResponse(status=status),
                         request=RequestFactory().get("/admin/x/"), exception=exc)
    finally:
        logging.getLogger().removeHandler(keep)
    [record] = [r for r in keep.records if r.name == "django.request"]
    assert (record.exc_info is not None) is traceback_kept
    assert "/admin/x/" in record.getMessage()
