"""ELMoForManyLangs' models by name (`efml:LANG`): the table, and the download, unpacking and conversion
of one archive, served by a loopback HTTP server (`tests.support.file_server`) found through
$ELMO_JAX_NLPL_URL, cached under tmp_path through $ELMO_JAX_CACHE. Nothing leaves the machine.

The table is checked against EFML's README (https://github.com/HIT-SCIR/ELMoForManyLangs, "Downloads":
44 languages at http://vectors.nlpl.eu/repository/11/136.zip ... 179.zip, in the README's order but for
Dutch, 164, listed after Norwegian Bokmål, 165).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile

import pytest

import elmo_jax
from elmo_jax.formats import download, published_models
from tests.support.file_server import FileServer

# EFML's README, its download table row by row (language, id), as published.
README_TABLE = [
    ("Arabic", 136), ("Bulgarian", 137), ("Catalan", 138), ("Czech", 139),
    ("Old Church Slavonic", 140), ("Danish", 141), ("German", 142), ("Greek", 143),
    ("English", 144), ("Spanish", 145), ("Estonian", 146), ("Basque", 147),
    ("Persian", 148), ("Finnish", 149), ("French", 150), ("Irish", 151),
    ("Galician", 152), ("Ancient Greek", 153), ("Hebrew", 154), ("Hindi", 155),
    ("Croatian", 156), ("Hungarian", 157), ("Indonesian", 158), ("Italian", 159),
    ("Japanese", 160), ("Korean", 161), ("Latin", 162), ("Latvian", 163),
    ("Norwegian Bokmål", 165), ("Dutch", 164), ("Norwegian Nynorsk", 166), ("Polish", 167),
    ("Portuguese", 168), ("Romanian", 169), ("Russian", 170), ("Slovak", 171),
    ("Slovene", 172), ("Swedish", 173), ("Turkish", 174), ("Uyghur", 175),
    ("Ukrainian", 176), ("Urdu", 177), ("Vietnamese", 178), ("Chinese", 179),
]  # fmt: skip
ZH = "11/179.zip"


def test_the_table_is_efmls_download_table():
    efml = {n: m for n, m in published_models.MODELS.items() if n.startswith("efml:")}
    assert len(efml) == 44
    found = sorted((m.language.removesuffix(" (Traditional)"), int(m.archive.path[3:-4])) for m in efml.values())
    assert found == sorted(README_TABLE)
    for name, model in efml.items():
        assert model.archive.published_url == f"http://vectors.nlpl.eu/repository/{model.archive.path}"
        assert model.archive.sha256 is None and model.archive.bytes is None  # nothing published: first use
        assert model.cache_name == name.replace(":", "-") and model.description
    zh = published_models.find("EFML:zh_hant")
    assert zh is published_models.find("efml:zh-tw") is published_models.MODELS["efml:zh"]
    assert zh.archive.path == ZH and zh.language == "Chinese (Traditional)"
    assert published_models.find("efml:no") is published_models.MODELS["efml:nb"]
    with pytest.raises(ValueError, match=r"the names are small, .*pubmed, and efml:LANG for LANG in ar bg .* zh$"):
        published_models.find("efml:xx")


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(download, "RETRY_PAUSE_S", 0.01)


@pytest.fixture
def nlpl(monkeypatch, tmp_path):
    """A loopback NLPL with nothing on it yet; the cache in tmp_path/cache."""
    monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
    with FileServer({}) as running:
        monkeypatch.setenv("ELMO_JAX_NLPL_URL", running.url)
        yield running


def zipped(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_an_archive_that_is_not_the_model_is_deleted_and_not_recorded(nlpl, tmp_path):
    downloads = tmp_path / "cache" / "downloads" / "efml-zh"
    nlpl.files[ZH] = b"<html>not found</html>"
    with pytest.raises(ValueError, match=r"published model 'efml:zh': .*179.zip is not a zip archive") as error:
        elmo_jax.pretrained.fetch("efml:zh", progress=False)
    assert "the downloaded archive was deleted" in str(error.value)
    assert not (downloads / "179.zip").exists() and not (tmp_path / "cache" / "known_files.json").exists()
    nlpl.files[ZH] = zipped({"zht.model/config.json": b"{}", "README": b"..."})
    with pytest.raises(ValueError, match="does not hold one ELMoForManyLangs model directory") as error:
        elmo_jax.pretrained.fetch("efml:zh", progress=False)
    assert "expected config.json, char.dic, word.dic, token_embedder.pkl, encoder.pkl together" in str(error.value)
    assert not (tmp_path / "cache" / "models" / "efml-zh").exists()
    assert sorted(p.name for p in downloads.iterdir()) == [".lock"]  # neither the archive nor what it unpacked


def test_the_way_out_names_the_nlpl_address_and_its_variable(nlpl, tmp_path, monkeypatch):
    with pytest.raises(elmo_jax.pretrained.PretrainedError) as error:
        elmo_jax.pretrained.fetch("efml:ja", progress=False)  # nothing served: HTTP 404
    message = str(error.value)
    assert message.startswith(f"{nlpl.url}11/160.zip: HTTP 404")
    assert "download http://vectors.nlpl.eu/repository/11/160.zip by any means" in message
    assert (
        f"$ELMO_JAX_NLPL_URL={nlpl.url!r}" in message and str(tmp_path / "cache" / "downloads" / "efml-ja") in message
    )
    monkeypatch.setenv("ELMO_JAX_NLPL_URL", "127.0.0.1:8000")
    with pytest.raises(ValueError, match=r"\$ELMO_JAX_NLPL_URL='127.0.0.1:8000' is not an http"):
        elmo_jax.pretrained.fetch("efml:ja", progress=False)
    assert nlpl.requests == [("11/160.zip", None)]


def test_a_name_with_a_colon_is_a_published_name_where_no_such_path_exists(tmp_path, monkeypatch):
    from elmo_jax.formats import model_source

    monkeypatch.chdir(tmp_path)
    assert model_source.names_published_model("efml:zh")
    os.mkdir("efml:zh")
    assert not model_source.names_published_model("efml:zh")  # a path that exists is always a path
    assert json.dumps(published_models.names_text()).count("efml:") == 1


@pytest.fixture(scope="module")
def efml_archive(fixture_dir) -> bytes:
    """tests/fixtures/efml/elmo (a tiny ELMoForManyLangs model directory) zipped as NLPL's archives are:
    its files at the top."""
    folder = fixture_dir.parent / "efml" / "elmo"
    return zipped({p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()})


def test_efml_zh_downloads_checks_unpacks_and_converts_once(nlpl, efml_archive, fixture_dir, tmp_path):
    """One conversion (a few CPU-seconds: the model directory's extractor.jax): the archive with its
    model in a folder, as some zips have it; then a changed archive at the same address is refused."""
    from elmo_jax.formats import model_source
    from elmo_jax.formats.efml import read_efml

    with zipfile.ZipFile(io.BytesIO(efml_archive)) as flat:
        nested = zipped({f"zht.model/{n}": flat.read(n) for n in flat.namelist()} | {"README": b"..."})
    nlpl.files[ZH] = nested
    expected = read_efml(fixture_dir.parent / "efml" / "elmo")
    params = elmo_jax.pretrained.load("efml:zh-hant", progress=False)
    assert params.config == expected.config and params.vocabulary == expected.vocabulary
    assert jax_tree_equal(params.weights, expected.weights)
    cache = tmp_path / "cache"
    assert sorted(os.listdir(cache)) == [".known_files.lock", "known_files.json", "models"]  # downloads removed
    assert os.path.isfile(cache / "models" / "efml-zh" / "vocabulary.json")
    known = json.loads((cache / "known_files.json").read_text())
    assert known[ZH]["bytes"] == len(nested) and known[ZH]["url"] == nlpl.url + ZH  # trust on first use
    assert model_source.load_model("efml:zh", None, None).vocabulary == expected.vocabulary
    assert nlpl.requests == [(ZH, None)]  # converted once, read from the cache after
    shutil.rmtree(cache / "models")
    nlpl.files[ZH] = efml_archive  # another file at the same address: refused against the first download's size
    expected_size = f"the server's file has {len(efml_archive):,} bytes, expected {len(nested):,}"
    with pytest.raises(elmo_jax.pretrained.PretrainedError, match=expected_size):
        elmo_jax.pretrained.fetch("efml:zh", progress=False)


def jax_tree_equal(a, b) -> bool:
    import jax
    import numpy as np

    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))
