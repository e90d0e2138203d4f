"""Driving the real Django admin over HTTP as an operator: CSRF on, forms read from the page.

``operator_client`` signs a user in through the login form of a client that enforces CSRF;
``form_fields`` reads every field of the change form from the rendered page (inputs, checked
boxes, selected options, text areas), so a test changes only what it forges and posts the rest
exactly as a browser would, CSRF token included.
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from django.test import Client


class _FormParser(HTMLParser):
    """The fields of the first ``<form>`` whose id ends in ``_form`` (the admin change form)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.fields: dict[str, str] = {}
        self._in_form = False
        self._select: str | None = None
        self._textarea: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "form" and a.get("id", "").endswith("_form"):
            self._in_form = True
        if not self._in_form:
            return
        name = a.get("name", "")
        if tag == "input" and name:
            kind = a.get("type", "text").lower()
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.fields[name] = a.get("value", "on") or "on"
            elif kind not in ("submit", "button", "file", "image"):
                self.fields[name] = a.get("value", "")
        elif tag == "select" and name:
            self._select = name
            self.fields.setdefault(name, "")
        elif tag == "option" and self._select is not None and "selected" in a:
            self.fields[self._select] = a.get("value", "")
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea is not None:
            self.fields[self._textarea] = "".join(self._text).lstrip("\n")
            self._textarea = None
        elif tag == "form":
            self._in_form = False


def operator_client(username: str, password: str) -> Client:
    """A CSRF-enforcing client signed in through the admin's own login form."""
    browser = Client(enforce_csrf_checks=True)
    page = browser.get("/admin/login/")
    token = page.cookies["csrftoken"].value
    response = browser.post("/admin/login/?next=/admin/", {
        "username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"})
    assert response.status_code == 302, response.content.decode()[:2000]
    return browser


def form_fields(browser: Client, url: str) -> dict[str, str]:
    """GET ``url`` (an admin add or change page) and return its form as a browser would post it."""
    page = browser.get(url)
    assert page.status_code == 200, (url, page.status_code)
    parser = _FormParser()
    parser.feed(page.content.decode())
    assert "csrfmiddlewaretoken" in parser.fields, "no CSRF token in the form"
    return parser.fields


def post_form(browser: Client, url: str, **forged: Any) -> Any:
    """GET the form at ``url``, replace the ``forged`` fields (None removes one), POST it back."""
    data = form_fields(browser, url)
    for name, value in forged.items():
        if value is None:
            data.pop(name, None)
        else:
            data[name] = str(value)
    return browser.post(url, data)
