"""The fields of a WebDataset sample that the image datasets read (``ringtier.torch`` and
``ringtier.tensorflow`` alike; no framework imported here)."""

from __future__ import annotations

from typing import Any, Optional

from .errors import CorruptError, InvalidInputError

#: The WebDataset fields taken as the image when ``image_field`` is not given, in order.
IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp")


def image_of(record: Any, field: Optional[str]) -> Any:
    """The image field of a WebDataset sample (``field``, or the first of :data:`IMAGE_FIELDS`)."""
    if field is not None:
        if field not in record:
            raise InvalidInputError(
                f"record {record.key!r} of shard {record.shard_key} has no image field {field!r} "
                f"(it has: {', '.join(record.names())})"
            )
        return record[field]
    for name in IMAGE_FIELDS:
        if name in record:
            return record[name]
    raise InvalidInputError(
        f"record {record.key!r} of shard {record.shard_key} has none of the image fields {IMAGE_FIELDS} "
        f"(it has: {', '.join(record.names())}); give image_field="
    )


def label_of_record(record: Any, field: str) -> int:
    """The integer label in a WebDataset sample's ``field`` (``cls``)."""
    if field not in record:
        raise InvalidInputError(
            f"record {record.key!r} of shard {record.shard_key} has no label field {field!r} "
            f"(it has: {', '.join(record.names())}); give label_field=None for images only"
        )
    text = record[field].to_bytes().strip()
    try:
        return int(text)
    except ValueError:
        raise CorruptError(
            f"record {record.key!r} of shard {record.shard_key}: label field {field!r} is not an integer: {text[:32]!r}"
        ) from None
