"""ELMoForManyLangs' models (issue #53): their directories read without torch (`formats.efml`,
`formats.torch_pickle`), and elmo-jax's vectors against the package's own outputs.

References: tests/fixtures/efml, made once by the `elmoformanylangs` package's code (its README says how):
two tiny random models, one per encoder the package ships ("elmo": ElmobiLm, pickles in torch.save's
legacy format; "lstm": LstmbiLm, zip format), and `Embedder.sents2elmo` of sentences in Chinese, Arabic
and English with unknown and over-long tokens. Two float32 computations of the same values in another
order: the bound is derived from rounding (tests/support/tolerance.py). Then an EFML directory given to
`Embedder`, `embed_file` and the service (in-process) gives the same vectors everywhere.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import jax
import jax.export
import numpy as np
import pytest

import elmo_jax
from elmo_jax.analysis import probing
from elmo_jax.formats import model_source
from elmo_jax.formats.efml import read_efml
from elmo_jax.formats.torch_pickle import LEGACY_MAGIC, LEGACY_PROTOCOL, read_state_dict
from elmo_jax.model.params import get_path, iter_flat
from elmo_jax.model.vocabulary import token_vocabulary
from elmo_jax.serving.service import ServiceConfig, build_app
from tests.support.commands import error_line
from tests.support.embed_files import read_all
from tests.support.inprocess import run_in_process
from tests.support.service_client import request, running
from tests.support.tolerance import assert_close_up_to_order, char_cnn_terms

FIXTURES = Path(__file__).parent / "fixtures" / "efml"
SENTENCES = json.loads((FIXTURES / "sentences.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def efml():
    """Both fixture models, read once: {"elmo": BiLMParams, "lstm": BiLMParams}."""
    return {name: read_efml(FIXTURES / name) for name in ("elmo", "lstm")}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The package's cache (where `--model=EFML_DIR` is converted) in a temporary folder."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("cache")
        patch.setenv("ELMO_JAX_CACHE", str(path))
        yield path


def terms(config, n_tokens: int) -> int:
    """The longest chain of dependent sums: the char CNN's, the projection's word columns, and per step
    and layer the gates' product (P inputs, P or H carried) and the recurrent or output projection (H)."""
    per_step = config.projection_dim + config.state_dim + config.lstm_dim
    return char_cnn_terms(config) + config.word_dim + config.n_layers * (n_tokens + 2) * per_step


def package_layers(name: str, reference, i: int) -> np.ndarray:
    """The package's layers of sentence i: "elmo" gives all three; "lstm" gives its top layer only (its
    encoder's output), the fixture adds the token embedder's (n, P) output, which its encoder reads."""
    if name == "elmo":
        return reference[f"layers_{i}"]
    tokens = reference[f"tokens_{i}"]
    return np.stack([np.concatenate([tokens, tokens], axis=-1), reference[f"layers_{i}"]])


@pytest.mark.parametrize("name", ["elmo", "lstm"])
def test_every_layer_of_every_sentence_equals_the_packages_own(efml, name):
    """Every layer (the token layer, each LSTM layer) of each sentence (Chinese, Arabic, English, a token
    over C-2 = 10 characters, unknown characters and words, the full-width space) within float32 rounding
    of the package's `sents2elmo(output_layer=-2)`, for each encoder."""
    params, reference = efml[name], np.load(FIXTURES / f"{name}_outputs.npz")
    vectors = elmo_jax.embed_sentences(params, SENTENCES)
    for i, (sentence, layers) in enumerate(zip(SENTENCES, vectors)):
        expected = package_layers(name, reference, i)
        assert layers.shape == expected.shape, (i, layers.shape, expected.shape)
        assert_close_up_to_order(layers, expected, terms(params.config, len(sentence)), f"{name} sentence {i}")


def test_both_pickle_formats_of_each_state_dict_read_the_same():
    """Each model's state dicts saved by torch.save in both formats (the released models' legacy one and
    today's zip; `other_format/` holds the one its directory does not use) read to the same arrays, every
    tensor the package's modules hold."""
    for name, legacy in (("elmo", True), ("lstm", False)):
        for part in ("token_embedder", "encoder"):
            own, other = FIXTURES / name / f"{part}.pkl", FIXTURES / name / "other_format" / f"{part}.pkl"
            assert zipfile.is_zipfile(own) != legacy and zipfile.is_zipfile(other) == legacy
            a, b = read_state_dict(own), read_state_dict(other)
            assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    encoder = read_state_dict(FIXTURES / "elmo" / "encoder.pkl")
    assert len(encoder) == 16 and encoder["forward_layer_1.state_projection.weight"].shape == (8, 16)
    assert read_state_dict(FIXTURES / "lstm" / "encoder.pkl")["encoder.weight_hh_l0_reverse"].shape == (64, 16)


def test_sents2elmo_answers_as_the_packages_output_layer_does(efml):
    """`Embedder.sents2elmo(sents, output_layer)`, the one-line switch: -1 is the package's average of the
    three layers (its own -1 output), -2 all of them, 1 the first LSTM layer."""
    embedder = elmo_jax.Embedder(params=efml["elmo"])
    reference = np.load(FIXTURES / "elmo_outputs.npz")
    config = efml["elmo"].config
    average, every = embedder.sents2elmo(SENTENCES), embedder.sents2elmo(SENTENCES, output_layer=-2)
    first = embedder.sents2elmo(SENTENCES[:2], output_layer=1)
    for i, sentence in enumerate(SENTENCES):
        n = terms(config, len(sentence))
        assert_close_up_to_order(average[i], reference[f"average_{i}"], n, f"sentence {i}")
        assert_close_up_to_order(every[i], reference[f"layers_{i}"], n, f"sentence {i}")
    for i in range(2):
        assert_close_up_to_order(first[i], reference[f"layers_{i}"][1], terms(config, len(SENTENCES[i])))
    with pytest.raises(ValueError, match=r"output_layer must be -2 \(all layers\), -1 .* a layer 0..2, found 3"):
        embedder.sents2elmo(SENTENCES, output_layer=3)


def test_an_efml_directory_embedded_served_and_through_embed_file_gives_the_same_vectors(efml, cache, tmp_path):
    """`Embedder(EFML_DIR)` (the directory converted once into the cache, as `--model=EFML_DIR` in every
    command), its `embed_file` and the service built as `python -m elmo_jax.serve` builds it: the vectors
    of the reader's model, and the service counts the tokens cut in characters, not bytes."""
    directory = str(FIXTURES / "elmo")
    embedder = elmo_jax.Embedder(directory, batch_tokens=256)
    assert [p.name for p in (cache / "models").iterdir()][0].startswith("efml-dir-")
    expected = elmo_jax.embed_sentences(efml["elmo"], SENTENCES)
    config = embedder.params.config
    for i, (got, want) in enumerate(zip(embedder.embed_batch(SENTENCES), expected)):
        assert_close_up_to_order(got, want, terms(config, len(SENTENCES[i])), f"Embedder, sentence {i}")
    lines = [s for s in SENTENCES if "\u3000" not in s]  # a file's tokens are split at white space
    (tmp_path / "in.txt").write_text("".join(" ".join(s) + "\n" for s in lines), encoding="utf-8")
    embedder.embed_file(str(tmp_path / "in.txt"), str(tmp_path / "out.hdf5"))
    datasets, _ = read_all(tmp_path / "out.hdf5")
    app = build_app(embedder.params, ServiceConfig(model=directory, workers=1, batch_tokens=256, warmup=False), None)
    with running(app) as port:
        status, headers, body = request(
            port, "POST", "/v1/embed", {"sentences": lines, "layers": "all"}, {"Accept": "application/x-npz"}
        )
    assert status == 200, body[:300]
    assert headers["x-truncated-tokens"] == "1"  # "Internationalization": over 10 characters (3 over 10 bytes)
    served = np.load(io.BytesIO(body))
    reference = elmo_jax.embed_sentences(embedder.params, lines)
    for i, sentence in enumerate(lines):
        n = terms(config, len(sentence))
        assert_close_up_to_order(datasets[str(i)], reference[i], n, f"embed_file, line {i + 1}")
        assert_close_up_to_order(served[str(i)], reference[i], n, f"service, sentence {i}")


def test_the_converted_directory_s_extractor_and_the_probes_read_the_model_s_vocabulary(efml, cache):
    """The model directory `--model=EFML_DIR` converts to holds vocabulary.json and an extractor.jax that,
    fed the vocabulary's ids, gives `embed`'s layers; the probes' embedding path takes the same ids."""
    directory = model_source.model_directory(str(FIXTURES / "lstm"))
    assert os.path.isfile(os.path.join(directory, "vocabulary.json"))
    params = elmo_jax.load(directory)
    sentences = [SENTENCES[0], SENTENCES[5]]
    ids = token_vocabulary(params).batch_ids(sentences)
    layers, mask = (np.asarray(a) for a in elmo_jax.embed(params, ids))
    with open(os.path.join(directory, "extractor.jax"), "rb") as f:
        exported = jax.export.deserialize(f.read())
    weights = dict(np.load(os.path.join(directory, "params.npz")))
    extracted, extracted_mask = (np.asarray(a) for a in exported.call(weights, ids))
    np.testing.assert_array_equal(extracted_mask, mask)
    assert_close_up_to_order(extracted, layers, terms(params.config, 6))
    for sentence, probed, row in zip(
        sentences, probing.sentence_layers(params, [tuple(s) for s in sentences], 64), layers
    ):
        assert_close_up_to_order(probed, row[:, : len(sentence)], terms(params.config, len(sentence)))


def copy_of(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    return target


def test_bad_efml_directories_are_refused_naming_the_file_and_key(tmp_path):
    """Each kind of damage gets an error that names the file and the key or entry, before any compute."""
    d = copy_of("elmo", tmp_path)
    lines = (d / "char.dic").read_text(encoding="utf-8").splitlines(keepends=True)
    (d / "char.dic").write_text("".join(line for line in lines if not line.startswith("<bow>")), encoding="utf-8")
    with pytest.raises(ValueError, match=r"char\.dic: missing the entry '<bow>'"):
        read_efml(d)
    (d / "char.dic").write_text("".join(lines[:3]) + "x\ty\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"char\.dic:4: expected an entry, a tab and an integer id, found 'x\\ty'"):
        read_efml(d)
    d = copy_of("lstm", tmp_path / "b")
    shutil.copy(FIXTURES / "elmo" / "encoder.pkl", d / "encoder.pkl")
    with pytest.raises(ValueError, match=r"encoder\.pkl: tensors do not match the architecture: missing \['encoder"):
        read_efml(d)
    architecture = json.loads((d / "tiny.json").read_text())
    architecture["encoder"]["n_layers"] = 2
    (d / "tiny.json").write_text(json.dumps(architecture))
    with pytest.raises(ValueError, match=r"tiny\.json: this ELMoForManyLangs model cannot be read: .*one layer"):
        read_efml(d)
    architecture["token_embedder"]["name"] = "lstm"
    (d / "tiny.json").write_text(json.dumps(architecture))
    with pytest.raises(ValueError, match=r"tiny\.json: token_embedder\.name is 'lstm'; only the char CNN"):
        read_efml(d)
    (d / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r'config\.json: missing "config_path"'):
        read_efml(d)
    os.unlink(d / "word.dic")
    with pytest.raises(FileNotFoundError, match=r"missing word\.dic; not an ELMoForManyLangs model directory"):
        read_efml(d)


class _Payload:
    """Unpickled by a plain unpickler, it would create `path`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_pickle_that_is_not_a_state_dict_is_refused_before_its_code_runs(tmp_path):
    """A legacy-format file whose object names os.mkdir (as a hostile file would name anything), a zip
    whose data.pkl does, and a truncated file: refused with the file named; nothing ran."""
    marker = tmp_path / "ran"
    legacy = tmp_path / "legacy.pkl"
    head = b"".join(pickle.dumps(v, protocol=2) for v in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": True}))
    legacy.write_bytes(head + pickle.dumps({"w": _Payload(str(marker))}, protocol=2))
    zipped = tmp_path / "zipped.pkl"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("model/data.pkl", pickle.dumps(_Payload(str(marker)), protocol=2))
    for path in (legacy, zipped):
        with pytest.raises(
            ValueError, match=rf"{path.name}: not a PyTorch state dict of tensors: it pickles \w+\.mkdir"
        ):
            read_state_dict(path)
    assert not marker.exists()
    truncated = tmp_path / "truncated.pkl"
    data = (FIXTURES / "elmo" / "encoder.pkl").read_bytes()
    truncated.write_bytes(data[: len(data) - 100])
    with pytest.raises(
        ValueError, match=r"truncated\.pkl: not a PyTorch state dict of tensors: storage .* bytes, expected"
    ):
        read_state_dict(truncated)


def test_export_converts_an_efml_directory_and_a_bad_one_is_one_error_line(efml, tmp_path):
    """`python -m elmo_jax.export --efml=DIR --output=OUT` writes a model directory that loads as the
    reader's model (vocabulary and weights); a damaged directory ends in one error line naming the file."""
    out = tmp_path / "zh"
    result = run_in_process("elmo_jax.export", f"--efml={FIXTURES / 'elmo'}", f"--output={out}", "--noextractor")
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = elmo_jax.load(str(out))
    assert loaded.config == efml["elmo"].config and loaded.vocabulary == efml["elmo"].vocabulary
    for path, array in iter_flat(efml["elmo"].weights):
        np.testing.assert_array_equal(np.asarray(get_path(loaded.weights, path)), np.asarray(array), err_msg=path)
    broken = copy_of("lstm", tmp_path)
    (broken / "encoder.pkl").write_bytes(b"not a pickle")
    result = run_in_process("elmo_jax.export", f"--efml={broken}", f"--output={tmp_path / 'x'}")
    error_line(result, "encoder.pkl", "cannot read it as a file of torch.save")
    assert not (tmp_path / "x").exists()
