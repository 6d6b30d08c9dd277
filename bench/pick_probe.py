"""Can the policy make the choice a multi-step kind hinges on, once it has seen the listing? For
`longest` (which file of a `wc -l` listing has the most lines), `crlf` (which script `file` marks
as CRLF) and, with --kinds, `chmod` (which program `ls -l` shows without x), the oracle's
trajectory is played in real containers up to the turn that names the file; there each file of the
listing is put in the oracle's command instead, and the policy scores every such command
token-exactly (the sum of its tokens' log-probs after the real prompt). Per
split (tasks of the config's generated_seed + 1: fresh draws of the counts SFT imitated, train;
of RL's, rl; of the eval's, heldout), per checkpoint:

    right      how often the right file's command scores highest (what greedy decoding writes there)
    P(right)   the right command's probability among the candidates, mean over tasks
    first      how often the first listed file's scores highest when it is not the right one
    chance     1 / the number of files, mean over tasks

    python bench/pick_probe.py runs/smollm2-multistep-sft250-seed0 runs/smollm2-multistep-ipa-rl-split-seed0

It separates what a sampled eval mixes: whether the policy reaches the decision turn, and whether
it decides right there; and whether a comparison learnt on one range of counts holds on another.
A run directory means its latest checkpoint's weights; a model directory is taken as it is.
"""
import argparse
import dataclasses
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from multistep_choices import LISTED, listing  # noqa: E402

SPLITS = ["train", "rl", "heldout"]


def model_dir(path: str) -> Path:
    """A run directory's latest checkpoint's model/, or a model directory itself."""
    p = Path(path)
    if (p / "config.json").exists():
        return p
    latest = p / "checkpoints" / "latest"
    model = p / "checkpoints" / (latest.read_text().strip() if latest.exists() else "-") / "model"
    if (model / "config.json").exists():
        return model
    raise SystemExit(f"{path}: neither a model directory (config.json) nor a run directory with a "
                     f"full-weights checkpoint (checkpoints/latest -> .../model); give one of those")


def decisions(kind: str, trajectories: list, fmt) -> list:
    """Per oracle trajectory: (the token ids before the deciding turn, each candidate turn's ids, the
    right one's index, the first listed one's index). The deciding turn is the first assistant turn
    after the listing whose command names the right file; a candidate puts a listed file there."""
    out = []
    for t in trajectories:
        names, right, k = [], None, -1
        for m in t.messages:
            if m["role"] == "assistant":
                k += 1
                cmd = (m.get("tool_call") or {}).get("arguments", {}).get("command", "")
                if right and right in cmd:
                    start = t.chunk_ids.index(k)
                    cands = [fmt.expert_ids(cmd.replace(right, n, 1)) for n in names]
                    out.append((t.token_ids[:start], cands, names.index(right), 0))
                    break
            elif m["role"] == "tool" and not names:
                names, right = listing(kind, m["content"])
    return out


def score(model, prefix: list, cands: list) -> list:
    """Each candidate's summed log-prob after `prefix`: the prefix runs once, each candidate on its
    KV cache, which is cut back to the prefix after it (candidates share hundreds of prompt tokens)."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prefix]), use_cache=True, logits_to_keep=1)
        cache, first = out.past_key_values, torch.log_softmax(out.logits[0, -1].float(), -1)
        got = []
        for c in cands:
            lp = torch.log_softmax(model(input_ids=torch.tensor([c]), past_key_values=cache,
                                         use_cache=True).logits[0].float(), -1)
            cache.crop(-len(c))
            got.append(first[c[0]].item() + sum(lp[j - 1, tok].item() for j, tok in enumerate(c) if j))
    return got


def summarise(scored: list) -> dict:
    """right, P(right), first and chance (the docstring's columns) of [(scores, right, first)]."""
    n = len(scored)
    best = [max(range(len(s)), key=s.__getitem__) for s, _, _ in scored]
    probs = [math.exp(s[r] - max(s)) / sum(math.exp(x - max(s)) for x in s) for s, r, _ in scored]
    wrong_first = [(b, f) for b, (_, r, f) in zip(best, scored) if r != f]
    return {"n": n, "right": sum(b == r for b, (_, r, _) in zip(best, scored)) / n,
            "p_right": sum(probs) / n, "chance": sum(1 / len(s) for s, _, _ in scored) / n,
            "first": sum(b == f for b, f in wrong_first) / max(1, len(wrong_first))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+",
                    help="run directories (their latest checkpoint) or model directories")
    ap.add_argument("--config", default="configs/smollm2-multistep.yaml",
                    help="the run config whose env, rollout format and tasks' seed the probe uses")
    ap.add_argument("--kinds", nargs="+", default=["longest", "crlf"], choices=list(LISTED))
    ap.add_argument("--splits", nargs="+", default=SPLITS, choices=SPLITS)
    ap.add_argument("--tasks", type=int, default=40, help="tasks of each kind in each split")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: torch's default, every core); 1 beside another CPU job, "
                         "where threads that wait on a busy core stall the rest many times over")
    args = ap.parse_args(argv)
    dirs = [model_dir(c) for c in args.checkpoints]

    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import chat
    import config
    import learner
    import rollout
    from env import make_env
    from generated_tasks import generate_tasks
    from policy import ScriptedPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config.load_config(ROOT / args.config, [])
    dtype = learner.compute_dtype(cfg, "cpu")  # model.dtype, as the run's engine samples on this CPU
    rcfg = dataclasses.replace(config.rollout_cfg(cfg), prefill_prob=0.0, group_redundancy=0)
    tok = AutoTokenizer.from_pretrained(dirs[0])
    fmt = chat.ChatFormat(tok, tools=rcfg.tools, template_kwargs=rcfg.chat_template_kwargs)
    env = make_env(cfg)
    cases = {}  # (kind, split) -> decisions, from the oracle's trajectories in real containers
    with ScriptedPolicy(tok, "oracle", template_kwargs=rcfg.chat_template_kwargs, tools=rcfg.tools) as oracle:
        for kind in args.kinds:
            for split in args.splits:
                tasks = generate_tasks("multistep", args.tasks, cfg.data.generated_seed + 1, split, [kind])
                played = rollout.collect(tasks, oracle, env, rcfg, group_size=1, progress=True)
                cases[kind, split] = decisions(kind, [t for t in played if t.valid and t.reward > 0], fmt)
    print(f"{'checkpoint':60s} {'kind':8s} {'split':8s} {'n':>3s} {'right':>6s} {'P(right)':>8s} "
          f"{'first':>6s} {'chance':>6s}")
    for d in dirs:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
        for (kind, split), got in cases.items():
            scored = [(score(model, p, c), r, f)
                      for p, c, r, f in tqdm(got, desc=f"{kind} {split}", leave=False)]
            s = summarise(scored)
            print(f"{str(d.relative_to(ROOT) if d.is_relative_to(ROOT) else d):60s} {kind:8s} {split:8s} "
                  f"{s['n']:3d} {s['right']:6.0%} {s['p_right']:8.2f} {s['first']:6.0%} {s['chance']:6.0%}",
                  flush=True)


if __name__ == "__main__":
    main()
