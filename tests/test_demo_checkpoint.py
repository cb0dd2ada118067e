"""The checkpoint shipped for the demo (``scanweaver_tvm/demo_model``: a Mamba trained here on
Shakespeare, saved by ``save_pretrained`` in bf16) is a real model: text through the command
line equals transformers', and int8 weights keep its choices (the quality a random model cannot
show: its near-tied logits flip under any rounding)."""
import json
import os

import numpy as np
import pytest
import torch
import transformers

import scanweaver_tvm as sw
from harness import teacher_forced
from scanweaver_tvm import cli
from scanweaver_tvm.demo import CHECKPOINT, PASSAGE

PROMPT = "KING RICHARD II:\nNow, my liege, what news from Ireland?\n"


@pytest.fixture(scope="module")
def tokenizer():
    return transformers.AutoTokenizer.from_pretrained(CHECKPOINT)


def test_the_checkpoint_is_as_published_small_and_bf16():
    """bf16 weights on disk (as checkpoints are published), a few MB, a tokenizer beside them."""
    from safetensors import safe_open

    with open(os.path.join(CHECKPOINT, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "mamba" and config["dtype"] == "bfloat16"
    with safe_open(os.path.join(CHECKPOINT, "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes == {"BF16"}
    assert sum(os.path.getsize(os.path.join(CHECKPOINT, n)) for n in os.listdir(CHECKPOINT)) < 8e6
    assert os.path.exists(os.path.join(CHECKPOINT, "tokenizer.json"))


def test_generate_from_the_directory_prints_transformers_text(capsys, tokenizer):
    """``scanweaver-tvm generate DIR --prompt TEXT``: compile_causal_lm on the directory (bf16 as
    stored) continues the prompt with the text transformers' greedy ``generate`` writes from the
    same directory; the continuation is varied text, not one token repeated."""
    new = 24
    code = cli.main(["generate", CHECKPOINT, "--prompt", PROMPT, "--max-new-tokens", str(new), "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    model = transformers.AutoModelForCausalLM.from_pretrained(CHECKPOINT).eval()
    assert model.dtype == torch.bfloat16
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=new, pad_token_id=tokenizer.eos_token_id)[0, ids.shape[1]:]
    assert len(set(tokens.tolist())) >= new // 2
    assert out.startswith(PROMPT + tokenizer.decode(tokens) + "\nprefill: "), out


def test_int8_weights_keep_the_trained_models_choices(tokenizer):
    """int8 weights (per output channel) on the trained model, run in float32 and fed the
    float32 model's greedy tokens over a sonnet it never saw: its next-token choice is float32's
    at 95% of the positions or more (the quantization issue's quality target), the logits
    within 5%."""
    model = transformers.AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    lm = sw.compile_causal_lm(model, weights="int8")
    ids = tokenizer(PASSAGE, return_tensors="pt")["input_ids"][:, :48]
    tokens, steps = teacher_forced(lm, model, ids, 24)
    agree = sum(int(got.argmax() == int(tokens[0, position + 1])) for position, got, _ in steps)
    worst = max(np.abs(got - want).max() / np.abs(want).max() for _, got, want in steps)
    assert agree >= 0.95 * len(steps), (agree, len(steps))
    assert worst <= 0.05, worst
