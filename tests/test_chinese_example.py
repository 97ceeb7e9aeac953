"""examples/README.md's Chinese biLM end to end: the synthetic corpus of examples/chinese_corpus.py, the
README's commands (3 training steps instead of 300, no heldout evaluation), a model that reads its own
characters (`data.characters = "corpus"`), its export and an embedding; and the character vocabulary's
pieces by hand (`data.char_vocabulary`, the batch stream's ids).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from configs import tiny
from elmo_jax.data import char_vocabulary
from elmo_jax.data.batch_stream import BiLMBatchStream
from elmo_jax.formats.vocab_file import Vocab
from elmo_jax.training import settings
from tests.support.inprocess import run_in_process

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[list[str]]:
    """The commands of examples/README.md's "A Chinese biLM" block, split as a shell would."""
    text = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## A Chinese biLM") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [shlex.split(line.split("  #")[0]) for line in block.splitlines() if line.strip()]


def in_dir(args: list[str], directory: Path) -> list[str]:
    """`args` with the README's relative paths (zh/..., runs/...) under `directory` (commands run
    in-process from the repository's root)."""
    return [re.sub(r"=((?:zh|runs)/)", lambda m: f"={directory}/{m.group(1)}", a) for a in args]


def corpus_module():
    spec = importlib.util.spec_from_file_location("examples_chinese_corpus", ROOT / "examples" / "chinese_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_characters_are_counted_by_words_and_read_one_id_each(tmp_path):
    # Hand-counted: 们 in 我们 (3) and 们 (1) = 4; 我 3; 好 2; <S> is not a word.
    characters = char_vocabulary.build_characters({"我们": 3, "们": 1, "好": 2, "<S>": 9})
    assert characters == ["们", "我", "好"]
    path = str(tmp_path / "characters.json")
    char_vocabulary.write_characters(path, characters)
    assert char_vocabulary.read_characters(path) == characters
    (tmp_path / "bad.json").write_text('{"format": "elmo-jax training characters", "characters": ["ab"]}')
    with pytest.raises(ValueError, match=r"bad.json: expected .*one character each"):
        char_vocabulary.read_characters(str(tmp_path / "bad.json"))
    config = tiny.get_config()
    config.model.max_characters_per_token = 6
    cfg = settings.step_config(config, 4, characters)  # what a run with data.characters "corpus" trains
    assert (cfg.model.char_vocab_size, cfg.model.char_specials) == (9, (0, 1, 2, 3, 4))
    vocabulary = cfg.vocabulary
    stream = BiLMBatchStream(
        ["我们 好", "我们我们我"], Vocab(["<S>", "</S>", "<UNK>", "好"]), batch_size=1, unroll_steps=4, seed=None,
        repeat=False, max_characters_per_token=6, vocabulary=vocabulary,
    )  # fmt: skip
    chars = next(stream)["forward"]["char_ids"][0]
    # Raw ids: bos 0, eos 1, bow 2, eow 3, pad 4, unknown 5; 们 6, 我 7, 好 8. <S> [bow, bos, eow, pad...];
    # 我们 [bow, 我, 们, eow, pad, pad]; 好; then the next sentence's <S> (inputs stop before </S>).
    assert chars.tolist() == [[2, 0, 3, 4, 4, 4], [2, 7, 6, 3, 4, 4], [2, 8, 3, 4, 4, 4], [2, 0, 3, 4, 4, 4]]
    chars = next(stream)["forward"]["char_ids"][0]
    assert chars[0].tolist() == [2, 7, 6, 7, 6, 3]  # 我们我们我: 5 characters cut to C - 2 = 4
    assert vocabulary.is_truncated("我们我们我") and not vocabulary.is_truncated("我们我们")


@pytest.mark.slow
def test_the_readme_trains_a_chinese_bilm_on_characters_and_embeds_with_it(tmp_path):
    """The README's commands in order, in-process, in tmp_path (a tiny training: ~15 CPU-s)."""
    commands = readme_commands()
    assert [c[:3] for c in commands] == [
        ["python", "examples/chinese_corpus.py", "--output_dir=zh"],
        ["pip", "install", "rjieba"],
        ["python", "-m", "elmo_jax.segment"],
        ["python", "train.py", "--config=configs/tiny.py"],
        ["python", "-m", "elmo_jax.embed_text"],
    ]
    zh = tmp_path / "zh"
    corpus_module().write_corpus(zh, n_train=200, n_heldout=20)  # the README's, fewer sentences
    if importlib.util.find_spec("rjieba") is not None:
        assert run_in_process("elmo_jax.segment", *in_dir(commands[2][3:], tmp_path)).returncode == 0
        raw, segmented = ((zh / f).read_text(encoding="utf-8").splitlines() for f in ("raw.txt", "segmented.txt"))
        assert [line.replace(" ", "") for line in segmented] == raw and all(" " in line for line in segmented)
    train = [a for a in commands[3][2:] if not a.startswith(("--config.num_train_steps", "--config.data.heldout"))]
    train = in_dir(train, tmp_path)
    result = run_in_process("train.py", *train, "--config.num_train_steps=3", "--config.export_extractor=False")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "zh"
    characters = char_vocabulary.read_characters(str(run / "characters.json"))
    assert set(characters) == set((zh / "train.txt").read_text(encoding="utf-8")) - {" ", "\n"}
    options = json.loads((run / "export" / "options.json").read_text())
    assert options["char_cnn"]["characters"] == "vocabulary"
    assert options["char_cnn"]["n_characters"] == char_vocabulary.FIRST + len(characters) + 1
    embedded = run_in_process("elmo_jax.embed_text", *in_dir(commands[4][3:], tmp_path))
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    assert "(1, 3, 7, 16)" in embedded.stdout  # 7 tokens, tiny.py's 2 x 8 wide layers
    assert "1 of 7 tokens are longer than the model's 6 characters and were cut to 6" in embedded.stderr
    from elmo_jax.formats import model_dir
    from elmo_jax.model.vocabulary import token_vocabulary

    vocabulary = token_vocabulary(model_dir.load(str(run / "export")))
    raw = vocabulary.token_ids("中华人民共和国") - 1  # 7 characters: the first 6 kept, one id each
    assert raw[0] == 2 and raw[7] == 3 and all(i >= char_vocabulary.UNKNOWN for i in raw[1:7])  # bow ... eow
