"""auto's host policy objects driven without a generation (no model, no drafter): made-up counts and step times in,
decisions out. The window policy and the cost model (`WindowPolicy`, `CostModel`), the init trials (`InitTrials`),
the memory across generations (`AutoMemory`) and the typed host read (`HostCounts`). The scenarios are built so that
the right decision follows from the rule with a wide margin either way."""
from specar.samplers.drafters.auto.drafter import HostCounts
from specar.samplers.drafters.auto import trials as trials_mod
from specar.samplers.drafters.auto import window as window_mod
from specar.samplers.drafters.auto.cost import RECENT, CostModel
from specar.samplers.drafters.auto.trials import InitTrials
from specar.samplers.drafters.auto.window import AutoMemory, WindowPolicy, candidate_windows


def _policy(kind="measured", max_window=16, costs=None) -> WindowPolicy:
    windows = candidate_windows(max_window)
    cost = CostModel(kind, windows)
    cost.set_costs(costs or {})
    return WindowPolicy(windows, cost)


def _count(policy, window, tokens, steps):
    """`steps` counted steps of `window` committing `tokens` per row (each smaller window credited min(n, W + 1))."""
    for _ in range(steps):
        policy.count_step(window, tokens, [min(tokens, w + 1) for w in policy.order])


def _run(policy, steps, step_time, tokens) -> list:
    """The host loop of a generation, as AutoDrafter.plan runs it: choose, probe, then the step's time and tokens."""
    chosen = []
    for s in range(steps):
        w = policy.choice = policy.choose()
        w = policy.step_window(s, w)
        chosen.append(w)
        policy.cost.measure(w, step_time(s, w), s)
        if s > window_mod.WARMUP_STEPS:
            _count(policy, w, tokens(w), 1)
    return chosen


def test_forwards_chooses_the_window_credited_with_more_tokens_beyond_the_switch_margin():
    # forwards: every step costs one forward, so the rate is the tokens per step; 10000 steps drown the prior
    policy = _policy("forwards")
    policy.choice = 8
    _count(policy, 8, 9.0, 10_000)
    _count(policy, 16, 9.2, 10_000)  # 2% more than the incumbent: inside SWITCH_MARGIN (10%), kept
    assert policy.choose() == 8
    _count(policy, 16, 20.0, 30_000)  # now about 1.6x the incumbent's: switched
    assert policy.choose() == 16


def test_a_smaller_window_must_beat_the_incumbent_by_the_down_margin():
    # measured costs: windows up to 4 cost half a step of 8 or 16; 4 commits 3.0 per step (rate 3 / 0.010), 8 and
    # 16 commit 5.0 (rate 5 / 0.020): 4 is 1.2x better, above SWITCH_MARGIN (1.1), under SWITCH_DOWN_MARGIN (1.25)
    costs = {w: (0.010 if w <= 4 else 0.020) for w in candidate_windows(16)}
    policy = _policy(costs=costs)
    for w, tokens in ((0, 1.0), (2, 2.0), (4, 3.0), (8, 5.0), (16, 5.0)):  # 10000 steps each: the prior drowned
        policy.tokens[w], policy.counted[w] = 10_000 * tokens, 10_000
    assert policy.choose() == 16
    policy.tokens[4] = 10_000 * 4.0  # 1.6x 16's rate: switched down
    assert policy.choose() == 4


def test_a_window_whose_measured_cost_doubles_is_left():
    true_cost = {w: 0.010 + 0.0005 * w for w in candidate_windows(16)}
    policy = _policy(costs=true_cost)

    def step_time(s, w):  # from step 40 on, a step of window 16 takes twice its calibrated time
        return true_cost[w] * (2.0 if w == 16 and s >= 40 else 1.0)
    chosen = _run(policy, 200, step_time, lambda w: min(w + 1, 12))
    assert chosen[20:40].count(16) >= 15, chosen  # 16 commits 12 per step for 0.018 s: the best rate before
    assert chosen[-40:].count(16) <= 4 and chosen[-40:].count(8) >= 30, chosen  # then 8 (9 per 0.014 s) wins


def test_a_probe_is_scheduled_every_probe_every_steps_after_the_warm_up():
    policy = _policy(costs={w: 0.010 + 0.0005 * w for w in candidate_windows(16)})
    first = window_mod.WARMUP_STEPS + window_mod.PROBE_EVERY
    assert [policy.probe(s, 16) for s in range(first)] == [None] * first
    assert policy.probe(first, 16) == 0  # plain AR first: its cost was never measured
    assert policy.probe(first + 1, 16) is None
    assert policy.probe(first + window_mod.PROBE_EVERY, 16) == 0  # still unmeasured: probed again
    assert _policy("forwards").probe(first, 16) is None  # the forwards cost model never probes


def test_one_odd_step_time_moves_no_cost_but_repeated_ones_do():
    windows = candidate_windows(8)
    cost = CostModel("measured", windows)
    cost.set_costs({w: 0.010 for w in windows})
    for s in range(10):  # windows 4 and 8 alternate at their calibrated cost: every rel 1, load 1
        cost.measure(4 if s % 2 else 8, 0.010, s)
    before = cost.cost(8)
    cost.measure(8, 0.500, 10)  # one step of 8 at 50x (a load spike)
    assert abs(cost.cost(8) / before - 1) < 0.01 and abs(cost.load() - 1) < 0.01
    for s in range(11, 11 + 4 * RECENT):  # window 8 really runs 3x its calibration, step after step
        cost.measure(4 if s % 2 else 8, 0.010 if s % 2 else 0.030, s)
    assert cost.cost(8) / cost.cost(4) > 2.5, (cost.rel(8), cost.rel(4))


def test_a_trial_block_of_the_other_init_and_its_margin():
    def block(trial_tokens):
        trials = InitTrials(("sample_above", "random"))
        start = window_mod.WARMUP_STEPS + trials_mod.INIT_TRIAL_AFTER
        # window 16 commits 3 tokens per step: under TRIAL_BELOW of its 17, room to gain
        seen = [trials.choose(s, 16, 30.0, 10) for s in range(start)]
        assert seen == ["sample_above"] * start
        for _ in range(trials_mod.INIT_COMPARED):
            trials.score("sample_above", 16, 3.0)
        tried = [trials.choose(s, 16, 30.0, 10) for s in range(start, start + trials_mod.INIT_TRIAL_STEPS)]
        assert tried == ["random"] * trials_mod.INIT_TRIAL_STEPS  # the trial block, from its scheduled step on
        for _ in range(trials_mod.INIT_TRIAL_STEPS - 1):  # its first step verified the other init's drafts
            trials.score("random", 16, trial_tokens)
        trials.choose(start + trials_mod.INIT_TRIAL_STEPS, 16, 30.0, 10)  # the block ended: the preference revised
        return trials.preferred, trials.trials[-1][-1]
    assert block(3.0 * 1.05) == ("sample_above", False)  # 5% more: under INIT_MARGIN (15%), the configured init stays
    assert block(3.0 * 1.5) == ("random", True)


def test_the_memory_primes_the_next_generation():
    """Generations on one model and setting, drafting steps at 5-7x an AR step's cost: the first finds that window 16
    commits 17 tokens per step (the formula's prior says 4.4), so the second, bound to the same memory, chooses 16
    at its first step where one without the memory chooses AR; the second finds window 16's steps at twice its
    calibration, so the third starts with 16's relative cost above its calibration."""
    class Model:  # the memory is kept per model (a weak reference)
        pass
    model, windows = Model(), candidate_windows(16)
    costs = {w: 0.050 + 0.001 * w if w else 0.010 for w in windows}
    calibrated = costs[16] / costs[0]

    def generation():
        policy = _policy(costs=costs)
        policy.bind(AutoMemory.recall(model, "setting", windows))
        return policy
    _count(generation(), 16, 17.0, 64)
    assert _policy(costs=costs).choose() == 0  # without the memory: the formula's prior, AR
    second = generation()
    assert second.choose() == 16
    for s in range(16):  # window 16 against AR, alternately: 16 at twice its calibrated time
        second.cost.measure(16 if s % 2 else 0, 2 * costs[16] if s % 2 else costs[0], s)
    fresh = _policy(costs=costs).cost
    assert fresh.cost(16) / fresh.cost(0) == calibrated
    third = generation()
    assert third.cost.cost(16) / third.cost.cost(0) > 1.5 * calibrated  # 16's rel samples carried over
    assert third.memory.generations == 3
    assert AutoMemory.recall(model, "another setting", windows).generations == 1  # per setting


def test_host_counts_read_by_name():
    order = candidate_windows(4)[::-1]  # (0, 2, 4)
    counts = HostCounts.read([9, 2, 2, 6, 9, 1, 3, 2], len(order))
    assert (counts.tokens, counts.rows, counts.credits) == (9, 2, (2, 6, 9))
    assert (counts.tree_rows, counts.tree_added, counts.want_tree) == (1, 3, 2)
    bare = HostCounts.read([9, 2, 2, 6, 9], len(order))  # a hint without the branches' entries
    assert (bare.credits, bare.tree_rows, bare.tree_added, bare.want_tree) == ((2, 6, 9), 0, 0, 0)
