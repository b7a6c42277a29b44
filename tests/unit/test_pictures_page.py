"""The building blocks of every HTML page: the vendored libraries are the ones the README
names, and nothing the job named can break out of the page's data."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from probing.cli.pictures import page


def test_the_vendored_libraries_are_the_files_their_readme_names() -> None:
    with open(os.path.join(page.VENDOR_DIR, "README.md"), encoding="utf-8") as handle:
        rows = re.findall(
            r"^\| (\S+\.js) \|.*\((\S+\.LICENSE)\) \| ([0-9a-f]{64}) \|$", handle.read(), re.MULTILINE
        )
    assert sorted(name for name, _, _ in rows) == sorted(page.LIBRARIES.values())
    for name, license, digest in rows:
        with open(os.path.join(page.VENDOR_DIR, name), "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == digest, name
        assert os.path.getsize(os.path.join(page.VENDOR_DIR, license)) > 0, license


@pytest.mark.parametrize("name", sorted(page.LIBRARIES))
def test_a_library_inlines_whole_and_without_its_source_map(name: str) -> None:
    script = page.library_script(name)
    assert script.startswith("<script>") and script.endswith("</script>")
    assert script.count("</script") == 1
    assert "sourceMappingURL" not in script


def test_data_cannot_close_its_element_and_keeps_its_value() -> None:
    hostile = {
        "thread": "</script><script>alert(1)</script>",
        "amp": "a&b",
        "line": "x\u2028y",
        "nan": float("nan"),
    }
    element = page.data_script("data", hostile)
    inner = element[len('<script type="application/json" id="data">') : -len("</script>")]
    assert "<" not in inner and ">" not in inner and "\u2028" not in inner
    assert json.loads(inner) == {**hostile, "nan": None}


def test_the_page_forbids_every_request() -> None:
    document = page.document("<b>t</b>", "", "<p>x</p>")
    assert "default-src 'none'" in document and "connect-src 'none'" in document
    assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in document
