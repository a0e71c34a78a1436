"""Damaged, newer, foreign or hostile bundles are refused with a BundleError that says what
is wrong; nothing else escapes and nothing reaches the C runtime unchecked."""
from __future__ import annotations

import json

import numpy as np
import pytest

import rockjit
from rockjit.runtime.bundle import BundleError

from .bundle_testutil import (
    block,
    example,
    join,
    part,
    replace_part,
    save_block,
    split,
    weights,
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("refuse") / "block.rjb"
    x, y = save_block(path)
    return path.read_bytes(), x, y


def _load(tmp_path, data: bytes, backend: str = "sim"):
    path = tmp_path / "edited.rjb"
    path.write_bytes(data)
    return rockjit.load(path, backend=backend)


def test_truncated_bundles(saved, tmp_path) -> None:
    data, _, _ = saved
    for n, msg in ((0, "too short"), (20, "too short"), (60, "runs past the end"),
                   (len(data) - 1, "runs past the end"), (len(data) // 2, "runs past the end")):
        with pytest.raises(BundleError, match=msg):
            _load(tmp_path, data[:n])


def test_flipped_bytes_fail_their_hash(saved, tmp_path) -> None:
    data, _, _ = saved
    manifest, parts = split(data)
    base = len(data) - len(parts)
    # a byte in the manifest
    bad = bytearray(data)
    bad[60] ^= 0x20
    with pytest.raises(BundleError, match="manifest's sha256"):
        _load(tmp_path, bytes(bad))
    # a byte inside each part
    for name, p in manifest["parts"].items():
        bad = bytearray(data)
        bad[base + p["offset"] + p["size"] // 2] ^= 1
        with pytest.raises(BundleError, match=f"part '{name}' does not match its sha256"):
            _load(tmp_path, bytes(bad))


def test_not_a_bundle(tmp_path) -> None:
    with pytest.raises(BundleError, match="bad magic"):
        _load(tmp_path, b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(BundleError, match="cannot read bundle"):
        rockjit.load(tmp_path / "missing.rjb")


def test_newer_format_versions_are_refused(saved, tmp_path) -> None:
    data, _, _ = saved
    manifest, parts = split(data)
    with pytest.raises(BundleError, match="container version 2 is newer"):
        _load(tmp_path, join(manifest, parts, version=2))
    manifest["format_version"] = 2
    with pytest.raises(BundleError, match="format version 2 is newer.*upgrade rockjit"):
        _load(tmp_path, join(manifest, parts))


def test_unknown_uapi_feature_is_refused(saved, tmp_path) -> None:
    data, _, _ = saved
    manifest, parts = split(data)
    manifest["uapi_features"].append("rocket-teleport")
    with pytest.raises(BundleError, match="rocket-teleport"):
        _load(tmp_path, join(manifest, parts))


def _for_chip(data: bytes, chip: str) -> bytes:
    """The same bundle claiming another chip in both the manifest and the image."""
    image = json.loads(part(data, "image.json"))
    image["profile"] = chip
    data = replace_part(data, "image.json", json.dumps(image).encode())
    manifest, parts = split(data)
    manifest["chip_profile"] = chip
    return join(manifest, parts)


def test_chip_mismatch(saved, tmp_path) -> None:
    data, x, y = saved
    with pytest.raises(BundleError, match="compiled for chip 'rk3576', which this rockjit does "
                                          "not know"):
        _load(tmp_path, _for_chip(data, "rk3576"))
    with pytest.raises(BundleError, match="compiled for chip 'rk3588', the backend 'sim:rk3576'"):
        _load(tmp_path, data, backend="sim:rk3576")
    # the manifest and the image disagree
    manifest, parts = split(data)
    manifest["chip_profile"] = "rk3576"
    with pytest.raises(BundleError, match="manifest says chip 'rk3576', the image 'rk3588'"):
        _load(tmp_path, join(manifest, parts))


def test_chip_of_the_rocket_device(saved, tmp_path) -> None:
    """A program for another registered chip is refused by the rocket device (an RK3588)."""
    from rockjit.lowering.profile import RK3588, get_profile, profile_names, register_profile
    import dataclasses

    if "test-other-chip" not in profile_names():
        register_profile(dataclasses.replace(RK3588, name="test-other-chip"))
    data, _, _ = saved
    with pytest.raises(BundleError, match="compiled for chip 'test-other-chip'; the rocket "
                                          "device is rk3588"):
        _load(tmp_path, _for_chip(data, "test-other-chip"), backend="rocket")
    assert get_profile("test-other-chip").cores == RK3588.cores


def test_image_index_out_of_range_never_reaches_the_runtime(saved, tmp_path) -> None:
    data, _, _ = saved
    image = json.loads(part(data, "image.json"))
    image["jobs"][0]["tasks"][0][0] = 999
    with pytest.raises(BundleError, match="names BO 999"):
        _load(tmp_path, replace_part(data, "image.json", json.dumps(image).encode()))
    image = json.loads(part(data, "image.json"))
    del image["steps"]
    with pytest.raises(BundleError, match="malformed"):
        _load(tmp_path, replace_part(data, "image.json", json.dumps(image).encode()))


def test_signature_disagreeing_with_image(saved, tmp_path) -> None:
    data, _, _ = saved
    manifest, parts = split(data)
    manifest["signature"]["inputs"][0]["shape"] = [8, 64]
    with pytest.raises(BundleError, match="signature disagrees"):
        _load(tmp_path, join(manifest, parts))


def test_part_encodings(saved, tmp_path) -> None:
    data, x, y = saved
    manifest, parts = split(data)
    m = json.loads(json.dumps(manifest))
    m["parts"]["weights.safetensors"]["encoding"] = "zstd"
    with pytest.raises(BundleError, match="encoded as 'zstd'.*upgrade rockjit"):
        _load(tmp_path, join(m, parts))
    m = json.loads(json.dumps(manifest))
    m["parts"]["weights.safetensors"]["raw_size"] -= 1
    with pytest.raises(BundleError, match="decompresses to .* the manifest says"):
        _load(tmp_path, join(m, parts))
    m = json.loads(json.dumps(manifest))
    m["parts"]["image.json"]["raw_size"] = 1 << 40
    with pytest.raises(BundleError, match="claims 1099511627776 bytes"):
        _load(tmp_path, join(m, parts))


def test_uncompressed_bundle_round_trips(tmp_path) -> None:
    """compress=False stores the parts as they are; the weights part is then a plain
    safetensors blob inside the file."""
    from rockjit.runtime.bundle import write_bundle

    p, x = weights(), example()
    f = rockjit.compile(block, resident_argnums=0, backend="sim")
    y = f(p, x)
    c = f.compiled(p, x)
    m = write_bundle(tmp_path / "raw.rjb", c.image, c.bundle_signature(), compress=False)
    assert {v["encoding"] for v in m["parts"].values()} == {"raw"}
    with rockjit.load(tmp_path / "raw.rjb", backend="sim") as b:
        got = b(x)
    for k in y:
        assert np.array_equal(got[k], y[k])


def test_fuzz_findings_are_refused(saved, tmp_path) -> None:
    """Regressions from the loader fuzz: values that passed the first checks but no C field
    can hold (a negative host-step offset reached cffi as an OverflowError), a JSON null
    dtype (np.dtype(None) is float64, then 'None' later), a uAPI feature that is a list."""
    data, _, _ = saved
    image = json.loads(part(data, "image.json"))
    step = next(s for s in image["steps"] if s["kind"] == "host")
    next(iter(step["host"]["operands"].values()))[1] = -8
    with pytest.raises(BundleError, match="outside its BO"):
        _load(tmp_path, replace_part(data, "image.json", json.dumps(image).encode()))
    image = json.loads(part(data, "image.json"))
    image["outputs"][0]["storage_dtype"] = None
    with pytest.raises(BundleError, match="not a numeric dtype"):
        _load(tmp_path, replace_part(data, "image.json", json.dumps(image).encode()))
    image = json.loads(part(data, "image.json"))
    image["jobs"][0]["tasks"][0][2] = 1 << 40
    with pytest.raises(BundleError, match="does not fit its regcmd BO"):
        _load(tmp_path, replace_part(data, "image.json", json.dumps(image).encode()))
    manifest, parts = split(data)
    manifest["uapi_features"] = [["submit"]]
    with pytest.raises(BundleError, match="uAPI features"):
        _load(tmp_path, join(manifest, parts))
