"""What a self-contained report page may not hold, checked outside its inline images.

A base64 PNG is random-looking text: "http" turns up inside one by chance (about once in a
hundred reports), so the checks strip the data URIs first and then look at what is left.
"""

import re

DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]*")


def outside_inline_images(html: str) -> str:
    """The page with every base64 data URI's payload cut out."""
    return DATA_URI.sub("data:", html)


def assert_self_contained(html: str) -> None:
    """No network resource and no script anywhere but inside an inline image's bytes."""
    text = outside_inline_images(html)
    assert "http" not in text, text[max(text.index("http") - 80, 0): text.index("http") + 80]
    assert "<script" not in text
