"""Installing us changes none of a platform's pins: pip's resolver on each profile's pins."""

from __future__ import annotations

import pytest

from tests.platforms.resolve import PROFILES, Profile, load, our_wheel, resolve


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """Our metadata-only wheel (pyproject.toml's ranges) and one with the ranges before issue 31."""
    dest = tmp_path_factory.mktemp("wheels")
    old = tmp_path_factory.mktemp("old")
    return {"ours": our_wheel(dest),
            "old": our_wheel(old, ["ipython>=8.0", "ipywidgets>=8.0", "matplotlib>=3.5"])}


def test_the_profiles_are_there():
    assert {"colab_gpu", "colab_tpu", "kaggle_gpu", "kaggle_tpu", "sagemaker_4_4"} <= set(PROFILES)
    for name in PROFILES:
        profile = load(name)
        assert {"ipython", "ipywidgets", "torch"} <= set(profile.pins), name


@pytest.mark.parametrize("extra", [None, "notebook"])
@pytest.mark.parametrize("name", PROFILES)
def test_our_install_keeps_every_pin(name, extra, wheels, tmp_path):
    profile = load(name)
    result = resolve(profile, wheels["ours"], extra, tmp_path)
    assert result.ok, f"{name}: pip cannot install notebook-accel[{extra}] beside the pins:\n{result.output}"
    assert not result.replaced, f"{name}: pip would replace {result.replaced}"
    if extra == "notebook" and "ipywidgets" not in profile.pins:
        assert "ipywidgets" in result.installs


def test_the_old_ranges_would_replace_colabs_ipython(wheels, tmp_path):
    """The check can fail: ``ipython>=8.0`` conflicts with Colab's pin (and google-colab's)."""
    result = resolve(load("colab_gpu"), wheels["old"], "notebook", tmp_path)
    assert not result.ok
    assert "ipython" in result.output and "conflict" in result.output.lower(), result.output


def test_the_google_colab_stand_in_requires_colabs_ipython(wheels, tmp_path):
    """Its requirement reaches the resolver: beside IPython 9 it cannot be installed."""
    profile = Profile("inconsistent", "3.13", {"google-colab": "1.0.0", "ipython": "9.5.0"})
    result = resolve(profile, wheels["ours"], "notebook", tmp_path)
    assert not result.ok and "google-colab" in result.output, result.output
