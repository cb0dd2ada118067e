"""The models ``bench.models`` times: our small models and transformers' causal LMs at the real
width with random weights, each as ``(module, example inputs)``; other benches
(``bench.dynamic``, ``bench.generate``, ``bench.tune_model``, ...) build the same models here."""


def make_model(name, length):
    from scanweaver_tvm import models

    if name == "mamba":
        return models.mamba_block(length=length)
    if name == "ema":
        return models.ema(length=length)
    if name == "hf_mamba":
        return hf_mamba(length)
    if name == "mamba2":
        return hf_mamba2(length)
    if name == "rwkv":
        return hf_rwkv(length)
    if name == "xlstm":
        return hf_xlstm(length)
    raise ValueError(name)


def logits_module(lm, last=False):
    """``lm(input_ids).logits`` as a module (what users time, and what peers convert); with
    ``last``, the last position's only (a first token)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            logits = self.lm(input_ids, use_cache=False).logits
            return logits[:, -1] if last else logits

    return Logits().eval()


def _ids(vocab, batch, length):
    import torch

    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))


def hf_mamba2(length, layers=2, batch=1):
    """transformers' ``Mamba2ForCausalLM`` at the real width of the 130m model (hidden 768,
    24 heads of head_dim 64, state 128, one group, chunk 256, vocabulary 50280), random weights."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    cfg = Mamba2Config(hidden_size=768, num_heads=24, head_dim=64, expand=2, state_size=128,
                       n_groups=1, chunk_size=256, num_hidden_layers=layers, vocab_size=50280)
    return logits_module(Mamba2ForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_rwkv(length, layers=2, batch=1):
    """transformers' ``RwkvForCausalLM`` at the real width of RWKV-4 169m (hidden 768,
    vocabulary 50280), random weights; its CPU path is the per-step WKV loop."""
    import torch
    from transformers import RwkvConfig, RwkvForCausalLM

    torch.manual_seed(0)
    cfg = RwkvConfig(hidden_size=768, num_hidden_layers=layers, vocab_size=50280,
                     context_length=max(1024, length))
    return logits_module(RwkvForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_xlstm(length, layers=2, batch=1):
    """transformers' ``xLSTMForCausalLM`` at hidden 768 (4 mLSTM heads of qk 96 / v 192, chunk
    64, vocabulary 50304), random weights: its inference path runs the chunkwise kernel on the
    whole chunks and the recurrent one on the rest."""
    import torch
    from transformers import xLSTMConfig, xLSTMForCausalLM

    torch.manual_seed(0)
    cfg = xLSTMConfig(hidden_size=768, num_heads=4, num_hidden_layers=layers, chunk_size=64,
                      vocab_size=50304)
    return logits_module(xLSTMForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]


def hf_mamba(length, layers=2, batch=1):
    """transformers' ``MambaForCausalLM`` at the real width (d_model 768, d_inner 1536, N 16;
    its default vocabulary), random weights, returning the logits as users time them."""
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    cfg = MambaConfig(hidden_size=768, state_size=16, num_hidden_layers=layers, expand=2)
    return logits_module(MambaForCausalLM(cfg).eval()), [_ids(cfg.vocab_size, batch, length)]
