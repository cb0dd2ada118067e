"""``scanweaver-tvm generate MODEL_DIR (--prompt TEXT | --prompt-ids 1,2,3) --max-new-tokens N
[--weights FORMAT]``: a transformers checkpoint compiled with ``compile_causal_lm``; prints the
continuation (text with ``--prompt``, through the checkpoint's own tokenizer; token ids with
``--prompt-ids``), then the prefill and decode rates (the first call's compilation not counted)."""
import os

from .cli_model import CLIError, quiet_transformers


def _ids(text):
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids: expected integers separated by commas, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise ValueError(f"--prompt-ids: expected at least one non-negative token id, got {text!r}")
    return ids


def cmd_generate(args, steps):
    with quiet_transformers(args.debug):
        return _generate(args, steps)


def _generate(args, steps):
    if not os.path.isdir(args.model_dir):
        raise CLIError(f"{args.model_dir}: no such checkpoint directory")
    tokenizer = _tokenizer(args.model_dir) if args.prompt is not None else None
    try:
        ids = tokenizer(args.prompt)["input_ids"] if tokenizer else _ids(args.prompt_ids)
    except ValueError as err:
        raise CLIError(str(err)) from None
    if not ids:
        raise CLIError("--prompt: the text has no tokens")
    from .causal_lm import compile_causal_lm

    with steps(f"loading {args.model_dir}", "cannot load the checkpoint"):
        lm = compile_causal_lm(args.model_dir, weights=args.weights)
    vocab = int(getattr(lm.config, "vocab_size", 0) or 0)
    if vocab and max(ids) >= vocab:
        raise CLIError(f"--prompt-ids: token {max(ids)} is outside the vocabulary ({vocab})")
    quantized = f" with {args.weights} weights" if args.weights else ""
    with steps(f"compiling prefill and decode{quantized}", "cannot compile the model"):
        lm.module()
    if args.seed is not None:
        import torch
        torch.manual_seed(args.seed)
    with steps(f"generating {args.max_new_tokens} tokens", "generation failed"):
        out = lm.generate([ids], max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          eos_token_id=args.eos_token_id)
    t = lm.last_timings
    new = [int(x) for x in out[0, len(ids):].tolist()]
    print(args.prompt + tokenizer.decode(new) if tokenizer else " ".join(map(str, new)))
    print(f"prefill: {t.prompt_tokens} tokens in {1e3 * t.prefill_s:.1f} ms ({t.prefill_tokens_per_s:.1f} tokens/s)")
    print(f"decode: {t.decode_steps} steps in {1e3 * t.decode_s:.1f} ms ({t.decode_tokens_per_s:.1f} tokens/s)")
    return 0


def _tokenizer(model_dir):
    """The checkpoint's tokenizer (``AutoTokenizer``), or a one-line error saying to pass ids."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CLIError(f"{model_dir}: no tokenizer to read --prompt with ({type(err).__name__}); "
                       "pass the token ids with --prompt-ids") from None


def add_parser(sub, parents, formatter_class, positive):
    """Register the ``generate`` subcommand on ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser("generate", parents=parents, formatter_class=formatter_class,
                       help="generate tokens from a transformers checkpoint (prefill + decode)",
                       description="Load MODEL_DIR with transformers' from_pretrained, compile its "
                                   "prefill (any prompt length) and one-token decode with "
                                   "scanweaver_tvm.compile_causal_lm (--weights: its dense layers' "
                                   "weights quantized), generate, and print the continuation (text "
                                   "with --prompt, token ids with --prompt-ids), then "
                                   "prefill and decode tokens/s.")
    p.add_argument("model_dir", metavar="MODEL_DIR", help="a checkpoint directory (config.json + weights)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT",
                        help="the prompt as text, read with the checkpoint's tokenizer; prints text")
    prompt.add_argument("--prompt-ids", metavar="IDS", help="the prompt's token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=positive, default=20, metavar="N")
    p.add_argument("--do-sample", action="store_true", help="sample (default: greedy)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--eos-token-id", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="torch.manual_seed before sampling")
    p.set_defaults(run=cmd_generate)
    return p
