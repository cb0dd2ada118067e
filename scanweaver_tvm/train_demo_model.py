"""Train the demo's checkpoint: a small ``MambaForCausalLM`` on Shakespeare's plays.

    python -m scanweaver_tvm.train_demo_model [--text bench/data/tinyshakespeare.txt.gz]
                                              [--minutes 16] [--out scanweaver_tvm/demo_model]

Why it exists: no checkpoint can be downloaded on the machines we build on, and a randomly
initialized model shows nothing (its greedy tokens are one token repeated, and any small change
flips its near-tied choices).  A model trained here has confident, readable predictions, so the
demo prints text and the quantization quality bench measures what a real checkpoint would show.

The text: the plays of Shakespeare (public domain), as collected in the 1.1 MB ``tinyshakespeare``
file of Karpathy's char-rnn repository (data/tinyshakespeare/input.txt), kept gzipped in
``bench/data/``; its last 5% is held out (the quality bench's prompts come from there).  A byte-level BPE
tokenizer of 2048 tokens is trained on it with the ``tokenizers`` package; the model (4 layers,
hidden 256, state 16, tied embeddings; 2.3 M parameters) is trained with AdamW on windows of
128 tokens, on the CPU (one thread), for the time given, and saved with ``save_pretrained`` in bfloat16, as
checkpoints are published, next to its tokenizer (4.6 MB).  Training is seeded; its speed (and
so the number of steps within ``--minutes``) depends on the machine, so the output is not
bit-reproducible across machines, which the demo does not need: it checks ours against
transformers on whatever checkpoint it loads.
"""
import argparse
import gzip
import math
import os
import time

import torch

VOCAB = 2048
WINDOW = 128
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "demo_model")
DEFAULT_TEXT = os.path.join(os.path.dirname(__file__), "..", "bench", "data", "tinyshakespeare.txt.gz")
HELD_OUT = 0.05          # the text's last 5%: never trained on


def read_text(path=DEFAULT_TEXT):
    """The training text (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def train_tokenizer(text):
    """A byte-level BPE tokenizer over ``text``, wrapped as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.split("\n\n"), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", unk_token="<|endoftext|>")


def build_model():
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(vocab_size=VOCAB, hidden_size=256, state_size=16, num_hidden_layers=4,
                         expand=2, conv_kernel=4, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return MambaForCausalLM(config)


def _mixer_for_training(mixer):
    """HF ``MambaMixer``'s function (no cache, no padding) with a backward that is fast on a
    CPU: transformers' reference scan indexes its (B, D, L, N) tensors one step at a time, and
    autograd writes a full-size gradient per index (90 s a backward at 16 x 256 tokens); here
    the steps are unbound once.  Checked equal to the mixer's own forward before training."""
    def forward(hidden_states, *args, **kwargs):
        seq_len = hidden_states.shape[1]
        x, gate = mixer.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)
        x = mixer.act(mixer.conv1d(x)[..., :seq_len])                          # (B, D, L)
        dt, b, c = torch.split(mixer.x_proj(x.transpose(1, 2)),
                               [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1)
        dt = torch.nn.functional.softplus(mixer.dt_proj(dt)).transpose(1, 2)  # (B, D, L)
        a = -torch.exp(mixer.A_log.float())                                    # (D, N)
        decay = torch.exp(dt[..., None] * a[:, None, :])                       # (B, D, L, N)
        push = (dt * x)[..., None] * b[:, None, :, :]                          # (B, D, L, N)
        state = torch.zeros_like(decay[:, :, 0])
        outputs = []
        for decay_t, push_t, c_t in zip(decay.unbind(2), push.unbind(2), c.unbind(1)):
            state = decay_t * state + push_t
            outputs.append((state * c_t[:, None, :]).sum(-1))
        y = (torch.stack(outputs, -1) + x * mixer.D[None, :, None]) * mixer.act(gate)
        return mixer.out_proj(y.transpose(1, 2))
    return forward


def _train_with_fast_mixers(model):
    """Replace each mixer's forward by ``_mixer_for_training`` after checking it computes the
    same as transformers' on a random batch; returns a function that restores them."""
    mixers = [layer.mixer for layer in model.backbone.layers]
    probe = torch.randint(0, VOCAB, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(probe).logits
        for mixer in mixers:
            mixer.forward = _mixer_for_training(mixer)
        got = model(probe).logits
    err = float((got - want).abs().max() / want.abs().max())
    if err > 1e-4:
        raise RuntimeError(f"the training mixer differs from transformers' (relative error {err:.1e})")

    def restore():
        for mixer in mixers:
            del mixer.forward
    return restore


def train(model, ids, minutes, batch=16, lr=3e-3, seed=0):
    """AdamW with a cosine schedule over the steps that fit in ``minutes`` (estimated from the
    first steps); returns the held-out loss (the last 5% of the text) per logged step."""
    gen = torch.Generator().manual_seed(seed)
    split = int((1 - HELD_OUT) * len(ids))
    train_ids, held_ids = ids[:split], ids[split:]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))

    def batch_of(source):
        starts = torch.randint(0, len(source) - WINDOW - 1, (batch,), generator=gen)
        x = torch.stack([source[s:s + WINDOW + 1] for s in starts.tolist()])
        return x[:, :-1], x[:, 1:]

    def held_out_loss():
        model.eval()
        with torch.no_grad():
            x, y = batch_of(held_ids)
            loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        model.train()
        return float(loss)

    model.train()
    start, step, steps, log = time.perf_counter(), 0, None, []
    while steps is None or step < steps:
        frac = step / steps if steps else 0.0
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * frac))
        x, y = batch_of(train_ids)
        loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 10:       # the schedule's length: the steps that fit in the time given
            steps = max(20, int(10 * 60 * minutes / (time.perf_counter() - start)))
        if step % 100 == 0 or step == steps:
            log.append((step, held_out_loss()))
            print(f"step {step}/{steps}: train loss {float(loss):.3f}, held-out {log[-1][1]:.3f}",
                  flush=True)
    return log


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=DEFAULT_TEXT, help="the training text (default: tinyshakespeare)")
    parser.add_argument("--minutes", type=float, default=16.0, help="training time (default 16)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"checkpoint directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)   # (thousands of small ops a step: with threads, each waits at a
    torch.manual_seed(0)       #  barrier, 20 s a step where another process holds a core)
    text = read_text(args.text)
    tokenizer = train_tokenizer(text)
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    print(f"{len(text)} characters, {len(ids)} tokens of a {VOCAB}-token BPE vocabulary")
    model = build_model()
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    restore = _train_with_fast_mixers(model)
    train(model, ids, args.minutes)
    restore()
    model.eval()
    model.to(torch.bfloat16).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    main()
