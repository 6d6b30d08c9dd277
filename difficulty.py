"""Which tasks an RL step draws: the seeded data order (plain, or kind by kind), and online
difficulty filtering.

A group whose episodes all got the same reward carries no signal for a group-baseline loss
(GRPO's r − mean is 0 on every row), and a task the policy never solves gives IPA's T+ term
nothing: such groups cost rollouts and train nothing. DAPO's dynamic sampling drops them after
rolling them out; prime-rl's online difficulty filtering, as here, stops drawing them: a task whose
latest `train.filter_window` episodes were all solved or all failed sits out the next
`train.filter_sit_out` steps, then is drawn again (and its latest episodes decide anew).

Everything here is pure (no torch, no I/O): a step's draw is a function of (seed, step, the
filter's state), and that state is a small dict that train.py saves in every checkpoint, so a
resumed run draws what an unbroken one would (tests/test_difficulty.py).
"""
import random


def step_tasks(tasks: list, step: int, n: int, seed: int, by_kind: bool = False) -> list:
    """Tasks for RL step `step`: the next n of a stream of per-epoch seeded permutations of `tasks`.
    by_kind (train.draw_by_kind): the stream takes the tasks' kinds (metadata "kind") in turn, in
    one seeded order, each kind's next task from its own such stream; every kind is then drawn once
    in every len(kinds) draws, where a plain permutation can leave a kind out for many steps and
    the policy drift on it unseen (tests/test_difficulty.py::test_a_draw_by_kind_*). Tasks of one
    kind draw as plainly."""
    kinds: dict = {}
    for t in tasks:
        kinds.setdefault(t.metadata.get("kind", "") if by_kind else "", []).append(t)
    if len(kinds) == 1:
        return [_nth(tasks, i, seed) for i in range(step * n, (step + 1) * n)]
    order = random.Random(f"{seed}-kinds").sample(sorted(kinds), len(kinds))
    return [_nth(kinds[order[k]], c, f"{seed}-{order[k]}")
            for c, k in (divmod(i, len(order)) for i in range(step * n, (step + 1) * n))]


def _nth(tasks: list, i: int, seed) -> object:
    """The i-th task of the stream of per-epoch seeded permutations of `tasks`."""
    epoch, j = divmod(i, len(tasks))
    return tasks[random.Random(f"{seed}-{epoch}").sample(range(len(tasks)), len(tasks))[j]]


def zero_adv_frac(outcomes: list, baseline: str) -> float:
    """The share of groups that carry no learning signal, from (group id, reward) per valid episode.
    Group baselines (grpo, rloo; batch too, whose groups then differ from the batch mean alone): a
    group whose rewards are all equal, so r − group mean is 0 on every row. baseline "none" (IPA
    as the paper writes it, absolute returns): a group without a success (reward > 0), which gives
    Eq. 9's T+ term nothing; with R in {0, 1} and algo.negative_reward 0 its advantages are all 0,
    with -1 it only pushes its own samples down. 0.0 for no groups."""
    groups: dict = {}
    for gid, reward in outcomes:
        groups.setdefault(gid, []).append(reward)
    if not groups:
        return 0.0
    if baseline == "none":
        silent = sum(all(r <= 0 for r in rs) for rs in groups.values())
    else:
        silent = sum(max(rs) - min(rs) <= 1e-8 for rs in groups.values())
    return silent / len(groups)


class DifficultyFilter:
    """Per task, its latest `window` episodes (1 solved, 0 not); a task whose window is full and all
    one value is benched: decided at step d, it is not drawn at steps d+1+lag .. d+lag+sit_out.
    `lag` is how many steps ahead of the trainer the rollouts are drawn (train.mode async: its
    max_staleness; sync: 0): a draw for step s reads only decisions of steps <= s-1-lag, the ones
    the trainer has surely recorded by then, so async draws are as deterministic as sync ones.
    window 0 = off: nothing is ever benched and the draw is step_tasks' own; by_kind is its by_kind."""

    def __init__(self, window: int, sit_out: int, lag: int = 0, by_kind: bool = False):
        self.window, self.sit_out, self.lag, self.by_kind = window, sit_out, lag, by_kind
        self.recent: dict[str, list[int]] = {}                 # task name -> latest outcomes, oldest first
        self.benched: dict[str, list[tuple[int, int]]] = {}    # task name -> [(step d, out through step)]

    def sitting_out(self, step: int) -> set:
        """Names of the tasks benched at RL step `step` (0-based, as step_tasks counts)."""
        benched = self.benched  # record() replaces it whole: the async producer reads one version
        return {name for name, spans in benched.items()
                if any(d <= step - 1 - self.lag and step <= until for d, until in spans)}

    def draw(self, tasks: list, step: int, n: int, seed: int) -> tuple[list, int, bool]:
        """(step `step`'s n tasks, how many tasks sat out, whether all did and the draw fell back to all
        of them). The epoch stream of step_tasks runs over the tasks not sitting out."""
        out = self.sitting_out(step) if self.window else set()
        eligible = [t for t in tasks if t.name not in out]
        return step_tasks(eligible or tasks, step, n, seed, self.by_kind), len(out), not eligible

    def record(self, step: int, outcomes: list):
        """Step `step`'s valid episodes, (task name, solved) each, from every rank. Within a step the
        order is sorted (episodes finish in any order), so a window is the same in every run."""
        if not self.window:
            return
        recent = {k: list(v) for k, v in self.recent.items()}
        benched = {k: [s for s in v if s[1] >= step] for k, v in self.benched.items()}  # expired spans go
        for name, solved in sorted(outcomes):
            recent.setdefault(name, []).append(int(bool(solved)))
            del recent[name][:-self.window]
        for name in sorted({name for name, _ in outcomes}):
            last = recent[name]
            if len(last) == self.window and len(set(last)) == 1:
                benched.setdefault(name, []).append((step, step + self.lag + self.sit_out))
        self.recent, self.benched = recent, {k: v for k, v in benched.items() if v}

    def state(self) -> dict:
        """What a checkpoint keeps (plain lists: torch.load reads it back with weights_only too)."""
        return {"recent": {k: list(v) for k, v in self.recent.items()},
                "benched": {k: [list(s) for s in v] for k, v in self.benched.items()}}

    def load(self, state: dict):
        """A checkpoint's state(); {} (a run from before the filter, or a fresh one) is empty."""
        self.recent = {k: list(v) for k, v in state.get("recent", {}).items()}
        self.benched = {k: [tuple(s) for s in v] for k, v in state.get("benched", {}).items()}


def pass_counts(outcomes) -> dict:
    """{task name: [episodes solved, episodes]} from (task name, solved) per valid episode, in
    first-seen order."""
    counts: dict = {}
    for name, solved in outcomes:
        c = counts.setdefault(name, [0, 0])
        c[0], c[1] = c[0] + bool(solved), c[1] + 1
    return counts


def moderate(outcomes) -> tuple[list, dict]:
    """(the names of the tasks both solved and failed, in first-seen order; their pass_counts) from
    (task name, solved) per valid episode: the paper's tasks of moderate difficulty, judged by the
    starting policy's own pass rate (evaluate.curate's filter, here on RL's tasks: train.curate_k).
    Only there does a group set a success beside a failure of the same task; a task always or never
    solved gives a successes-only or group-baseline loss nothing to contrast."""
    counts = pass_counts(outcomes)
    return [n for n, (s, k) in counts.items() if 0 < s < k], counts
