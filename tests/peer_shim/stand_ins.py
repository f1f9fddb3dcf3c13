"""Local stand-ins for what the peer's examples download: datasets, metrics, tokenizers, weights.

``install()`` replaces only data loading, nothing the examples train with:
``datasets.load_dataset`` returns a small synthetic ``DatasetDict`` (GLUE MRPC's
columns, or wikitext's ``text``), ``evaluate`` is a module whose ``load`` gives an
accuracy/F1 metric with the ``add_batch``/``compute`` API, and the ``Auto*.from_pretrained``
the examples call build a tiny tokenizer (a ``tokenizers`` WordLevel model made in
memory) and tiny models from configs (random weights). transformers runs as where
accelerate is not installed (it would import the peer's internals, which the shim does
not have), and without peft. Hugging Face's offline switches are set, so anything not replaced fails
instead of downloading.
"""

from __future__ import annotations

import os
import random
import sys
import types
from typing import Any

WORDS = [f"w{i}" for i in range(60)]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<eos>"]
ROWS = {"train": 64, "validation": 32, "test": 32}  # a few steps per epoch on 2 processes
WIKITEXT_ROWS = {"train": 500, "validation": 32, "test": 32}  # the autoregressive example selects 500
MAX_LENGTH = 64


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))


def mrpc(split: str, rows: int) -> dict[str, list]:
    """GLUE MRPC's columns: the label is 1 when both sentences start with the same word (learnable)."""
    rng = random.Random(f"mrpc-{split}")
    columns: dict[str, list] = {"sentence1": [], "sentence2": [], "label": [], "idx": []}
    for i in range(rows):
        first, second = _sentence(rng), _sentence(rng)
        label = i % 2
        if label:
            second = first.split()[0] + " " + second
        columns["sentence1"].append(first)
        columns["sentence2"].append(second)
        columns["label"].append(label)
        columns["idx"].append(i)
    return columns


def wikitext(split: str, rows: int) -> dict[str, list]:
    """wikitext's one ``text`` column, with the empty lines the examples filter out."""
    rng = random.Random(f"wikitext-{split}")
    return {"text": ["" if i % 5 == 4 else _sentence(rng) for i in range(rows)]}


DATASETS = {("nyu-mll/glue", "mrpc"): (mrpc, ROWS), ("glue", "mrpc"): (mrpc, ROWS),
            ("Salesforce/wikitext", "wikitext-2-v1"): (wikitext, WIKITEXT_ROWS),
            ("Salesforce/wikitext", "wikitext-2-raw-v1"): (wikitext, WIKITEXT_ROWS)}


def load_dataset(path: str, name: str | None = None, *args: Any, split: str | None = None, **kwargs: Any) -> Any:
    """``datasets.load_dataset`` for the datasets the examples load: synthetic, in memory."""
    import datasets

    if (path, name) not in DATASETS or split is not None:
        raise ValueError(f"load_dataset({path!r}, {name!r}, split={split!r}): no synthetic stand-in "
                         f"(known: {sorted(DATASETS)}, whole DatasetDicts only)")
    make, rows = DATASETS[(path, name)]
    return datasets.DatasetDict({s: datasets.Dataset.from_dict(make(s, n)) for s, n in rows.items()})


class GlueMetric:
    """GLUE MRPC's metric (accuracy and binary F1) with ``evaluate``'s ``add_batch``/``compute`` API."""

    def __init__(self) -> None:
        self.predictions: list[int] = []
        self.references: list[int] = []

    def add_batch(self, *, predictions: Any, references: Any) -> None:
        self.predictions += [int(p) for p in predictions]
        self.references += [int(r) for r in references]

    def compute(self, *, predictions: Any = None, references: Any = None) -> dict[str, float]:
        if predictions is not None:
            self.add_batch(predictions=predictions, references=references)
        pairs = list(zip(self.predictions, self.references, strict=True))
        self.predictions, self.references = [], []
        if not pairs:
            raise ValueError("compute() with no predictions: add_batch was never called")
        true_pos = sum(p == r == 1 for p, r in pairs)
        predicted, actual = sum(p for p, _ in pairs), sum(r for _, r in pairs)
        f1 = 2 * true_pos / (predicted + actual) if predicted + actual else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / len(pairs), "f1": f1}


def _evaluate_module() -> types.ModuleType:
    module = types.ModuleType("evaluate", "a stand-in for Hugging Face evaluate: GLUE MRPC's metric only")

    def load(path: str, config_name: str | None = None, **kwargs: Any) -> GlueMetric:
        if (path, config_name) != ("glue", "mrpc"):
            raise ValueError(f"evaluate.load({path!r}, {config_name!r}): only ('glue', 'mrpc') has a stand-in")
        return GlueMetric()

    module.load = load
    return module


def tokenizer(name: str, **kwargs: Any) -> Any:
    """A fast tokenizer over the synthetic words; BERT-style pairs ([CLS] a [SEP] b [SEP]) for BERT names."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if "bert" in name.lower():
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_LENGTH, pad_token="[PAD]",
                                       unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=MAX_LENGTH, unk_token="[UNK]",
                                   eos_token="<eos>", bos_token="<eos>", pad_token="[PAD]")


def tiny_config(name: str) -> Any:
    """A tiny config of the architecture ``name`` has (random weights are built from it)."""
    import transformers

    vocab = len(SPECIAL) + len(WORDS)
    small = {"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": MAX_LENGTH}
    configs = {
        "bert-base-cased": lambda: transformers.BertConfig(**small, pad_token_id=0),
        "HuggingFaceTB/SmolLM-360M": lambda: transformers.LlamaConfig(**small, num_key_value_heads=2,
                                                                      pad_token_id=0, eos_token_id=4,
                                                                      bos_token_id=4, tie_word_embeddings=True),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2,
                                                n_positions=MAX_LENGTH, bos_token_id=4, eos_token_id=4),
    }
    if name not in configs:
        raise ValueError(f"from_pretrained({name!r}): no tiny stand-in (known: {sorted(configs)})")
    return configs[name]()


def _model_loader(auto_class: Any) -> Any:
    """``from_pretrained`` building ``auto_class`` from ``config`` or the tiny config (random weights).

    The examples' other keywords (``return_dict=True``, ``low_cpu_mem_usage``, ``from_tf``) are
    loading options or the config's defaults already.
    """
    def from_pretrained(cls: Any, name: str, *args: Any, config: Any = None, **kwargs: Any) -> Any:
        return auto_class.from_config(config if config is not None else tiny_config(name))

    return classmethod(from_pretrained)


def _transformers_without_accelerate() -> None:
    # transformers (and peft, which it imports when installed) import accelerate's internals
    # (accelerate.hooks, accelerate.utils.deepspeed) wherever the accelerate distribution is
    # installed; the shim has only the public names. transformers runs here as where accelerate
    # is not installed (what a user switching to notebook_accel has); peft needs accelerate.
    import transformers.utils
    from transformers.utils import import_utils

    def unavailable(*args: Any, **kwargs: Any) -> bool:
        return False

    for check in ("is_accelerate_available", "is_peft_available"):
        setattr(import_utils, check, unavailable)
        setattr(transformers.utils, check, unavailable)


def install() -> None:
    """Replace data loading (datasets, metrics, tokenizers, pretrained weights) with the stand-ins above."""
    for switch in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[switch] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers

    _transformers_without_accelerate()
    datasets.load_dataset = load_dataset
    sys.modules["evaluate"] = _evaluate_module()
    transformers.AutoTokenizer.from_pretrained = classmethod(lambda cls, name, *a, **k: tokenizer(name))
    transformers.AutoConfig.from_pretrained = classmethod(lambda cls, name, *a, **k: tiny_config(name))
    for auto in ("AutoModelForSequenceClassification", "AutoModelForCausalLM"):
        original = getattr(transformers, auto)
        original.from_pretrained = _model_loader(original)
