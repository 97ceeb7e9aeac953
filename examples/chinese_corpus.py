"""A small synthetic Chinese corpus for trying a biLM on a language written without spaces.

    python examples/chinese_corpus.py --output_dir=zh

writes, from a fixed seed (the same text every time; no download):

    zh/raw.txt        sentences as Chinese is written: no spaces (what `python -m elmo_jax.segment` takes)
    zh/train.txt      the same sentences segmented, words separated by spaces (what training reads)
    zh/heldout.txt    other sentences, segmented, for the heldout perplexity

The sentences come from a small grammar (subject, time, place, verb, object; now and then a long
compound word) over about a hundred common words, so a tiny biLM has something to learn in a few
hundred steps. examples/README.md ("A Chinese biLM") uses it; tests/test_chinese_example.py runs those
commands.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
from absl import app, flags

SUBJECTS = ["我", "你", "他", "她", "我们", "他们", "老师", "学生", "医生", "朋友", "妈妈", "爸爸", "孩子", "公司"]
TIMES = ["今天", "明天", "昨天", "早上", "晚上", "周末", "现在", "去年"]
PLACES = ["在北京", "在上海", "在学校", "在家里", "在公园", "在图书馆", "在医院", "在商店"]
VERBS = ["喜欢", "学习", "看", "买", "写", "读", "吃", "做", "找", "认识", "参观", "讨论"]
OBJECTS = ["中文", "电影", "苹果", "书", "报纸", "问题", "朋友", "音乐", "汉字", "工作", "咖啡", "地图", "照片"]
# Compound words longer than a small model's character limit (tokens cut to C - 2 characters).
LONG = ["中华人民共和国", "自然语言处理技术", "北京大学图书馆", "人工智能研究所"]
ENDINGS = ["。", "了。", "吗？", "！"]


def sentence(rng: np.random.Generator) -> list[str]:
    """One sentence as its words."""
    words = [str(rng.choice(SUBJECTS))]
    if rng.random() < 0.5:
        words.append(str(rng.choice(TIMES)))
    if rng.random() < 0.4:
        place = str(rng.choice(PLACES))
        words += [place[0], place[1:]]  # 在 + the place: two words
    words.append(str(rng.choice(VERBS)))
    words.append(str(rng.choice(LONG if rng.random() < 0.1 else OBJECTS)))
    ending = str(rng.choice(ENDINGS))
    return words + ([ending[0], ending[1]] if len(ending) == 2 else [ending])


def write_corpus(output_dir: str | pathlib.Path, n_train: int = 600, n_heldout: int = 60, seed: int = 0) -> dict:
    """Writes raw.txt, train.txt and heldout.txt (see the module doc) into `output_dir`; returns their paths."""
    rng = np.random.default_rng(seed)
    train = [sentence(rng) for _ in range(n_train)]
    heldout = [sentence(rng) for _ in range(n_heldout)]
    out = pathlib.Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / f"{name}.txt" for name in ("raw", "train", "heldout")}
    paths["raw"].write_text("".join("".join(s) + "\n" for s in train), encoding="utf-8")
    paths["train"].write_text("".join(" ".join(s) + "\n" for s in train), encoding="utf-8")
    paths["heldout"].write_text("".join(" ".join(s) + "\n" for s in heldout), encoding="utf-8")
    return {name: str(path) for name, path in paths.items()}


FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Directory to write raw.txt, train.txt and heldout.txt into.")


def main(argv) -> None:
    if len(argv) > 1 or not FLAGS.output_dir:
        print("error: pass --output_dir=DIR (and no other arguments)", file=sys.stderr)
        sys.exit(1)
    try:
        paths = write_corpus(FLAGS.output_dir)
    except OSError as e:
        print(f"error: --output_dir={FLAGS.output_dir}: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    print(", ".join(paths.values()))


if __name__ == "__main__":
    app.run(main)
