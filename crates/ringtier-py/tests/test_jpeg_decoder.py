"""``ringtier.JPEG_DECODER``: the JPEG decoder the installed extension decodes with. The wheels
carry libjpeg-turbo, linked statically (``build-wheels.sh`` checks it); a source build decodes
with zune-jpeg unless built with feature ``turbojpeg``. ``RINGTIER_EXPECT_JPEG_DECODER`` says
which one this run must find (CI's run against the installed wheel: ``libjpeg-turbo``)."""

from __future__ import annotations

import os

import pytest

import ringtier
import ringtier._ringtier as ext


def test_the_package_names_its_jpeg_decoder():
    assert ringtier.JPEG_DECODER in ("libjpeg-turbo", "zune-jpeg")
    assert ringtier.JPEG_DECODER == ext.JPEG_DECODER
    assert "JPEG_DECODER" in ringtier.__all__
    from ringtier import JPEG_DECODER

    assert isinstance(JPEG_DECODER, str)


def test_the_decoder_is_the_one_expected():
    want = os.environ.get("RINGTIER_EXPECT_JPEG_DECODER")
    if not want:
        pytest.skip("RINGTIER_EXPECT_JPEG_DECODER is not set (CI sets it for the wheel)")
    assert ringtier.JPEG_DECODER == want, f"this build decodes with {ringtier.JPEG_DECODER}, {want} expected"
