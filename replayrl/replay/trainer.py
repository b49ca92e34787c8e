"""GRPO with a replay buffer: zero-std groups earn informative data kept from earlier batches.

Semantics (docs/replay.md): after a batch is generated and scored, every group whose rewards are all equal
(within `replay_zero_std_atol`) carries no advantage; by default (`replay_placement="append"`,
`replay_unit="rollout"`) each earns G buffered rollouts that beat their own group, appended to the batch; with
`replay_unit="group"` one buffered group drawn in proportion to its score, appended, or with "replace" swapped
in. Decisions are taken on the global batch, identically on every process (one logical buffer); each process
appends to (or swaps) its own rows. Groups with variance enter the
buffer after their first loss pass, carrying their behaviour log-probs and policy version, so a replayed
group is trained as the off-policy data it is: by default with truncated importance weights against the
behaviour log-probs (`replay_importance_cap`), else the PPO ratio against them. `replay_strategy="mix"` instead puts
a prompt's stored success into its own all-failed group (ExGRPO; `replay/mixing.py`).
"""

from __future__ import annotations

import logging
import math

import torch
from accelerate.utils import gather_object
from torch import Tensor

from replayrl import algos
from replayrl.data.vision import has_images
from replayrl.grpo.rollout import Rollout
from replayrl.grpo.trainer import GRPOTrainer
from replayrl.replay.buffer import ReplayBuffer, group_score
from replayrl.replay.config import GRPOWithReplayBufferConfig
from replayrl.replay.diagnostics import replay_loss_metrics
from replayrl.replay.mixing import STORE_PROMPTS, SuccessStore, mix_into_group, prompt_key, successes_of_group
from replayrl.replay.update import TRLReplayMethodsMixin

logger = logging.getLogger(__name__)


class GRPOWithReplayBufferTrainer(TRLReplayMethodsMixin, GRPOTrainer):
    """[`GRPOTrainer`] with a replay buffer. Same constructor; `args` is a [`GRPOWithReplayBufferConfig`]."""

    _tag_names = ["trl", "grpo", "replayrl", "replay-buffer"]
    _name = "GRPO with replay buffer"  # the method on the model card (replayrl.model_card.METHODS)
    # TRL's replay trainer tests build it without data to call update_with_replay_buffer & co.; train() refuses
    _train_dataset_optional = True

    @staticmethod
    def _default_config(output_dir: str) -> GRPOWithReplayBufferConfig:
        return GRPOWithReplayBufferConfig(output_dir=output_dir)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.args
        size = getattr(cfg, "replay_buffer_size", 0)
        self.replay_buffer = (
            ReplayBuffer(
                size,
                seed=cfg.seed,
                max_age=getattr(cfg, "replay_max_age", None),
                max_reuse=getattr(cfg, "replay_max_reuse", None),
            )
            if size > 0
            else None
        )
        self.success_store = None
        if size > 0 and getattr(cfg, "replay_strategy", "group") != "group":
            max_age, max_reuse = getattr(cfg, "replay_max_age", None), getattr(cfg, "replay_max_reuse", None)
            self.success_store = SuccessStore(STORE_PROMPTS, max_age, max_reuse)
            if has_images(self.train_dataset):  # a success is keyed by its prompt's tokens, blind to the image
                raise ValueError(
                    f"replay_strategy={cfg.replay_strategy!r} with an image dataset is not supported: stored "
                    "successes are matched by prompt tokens, which are the same for different images. Use "
                    "replay_strategy='group'."
                )
        self._appends = getattr(cfg, "replay_placement", "replace") == "append"
        if (
            self._appends
            and type(self).update_with_replay_buffer is not TRLReplayMethodsMixin.update_with_replay_buffer
        ):
            # TRL's extension point is the swap: a subclass that overrides it gets the swap it was written for
            logger.warning(
                f"{type(self).__name__} overrides update_with_replay_buffer, which decides what replaces zero-std "
                "groups: using replay_placement='replace' (the default 'append' never calls it)."
            )
            self._appends = False
        self._replayed_uids: set[int] = set()  # for replay/distinct_frac (since the start of training)
        self._replays = 0

    # ------------------------------------------------------------------ replace zero-std groups
    def _postprocess_rollout(self, rollout: Rollout) -> Rollout:
        if self.replay_buffer is None:
            return rollout
        strategy = getattr(self.args, "replay_strategy", "group")
        if self.success_store is not None:
            rollout = self._mix_successes(rollout)
        if strategy == "mix":
            zero = algos.zero_std_groups(rollout.rewards, self.num_generations, self.args.replay_zero_std_atol)
            all_zero = self.accelerator.gather(zero)
            self._metrics["train"]["replay/frac_zero_std_trained"].append(float(all_zero.float().mean()))
        elif self._appends:
            rollout = self._append_buffered_groups(rollout)
        else:
            rollout = self._replace_zero_std_groups(rollout)
        self._table_shows_trained_rows(rollout)
        return rollout

    def _table_shows_trained_rows(self, rollout: Rollout) -> None:
        """With `log_completions`: the completions table shows what is trained, a `replayed` column says which
        rows came from the buffer (appended rows are added to the table); those show their stored text, reward and
        advantage (their per-function rewards are None: the buffer keeps only the weighted sum)."""
        table = self._last_completions
        if not (self.args.log_completions and table) or len(table["prompt"]) > rollout.num_rows:
            return
        extra = rollout.num_rows - len(table["prompt"])
        if extra:  # replay_placement="append": one more row per appended row, filled below (other columns None)
            for column in list(table):
                table[column] = list(table[column]) + [None] * extra
        replayed = rollout.replayed.tolist()
        table["replayed"], table["advantage"] = replayed, rollout.advantages.tolist()
        rows = [i for i, flag in enumerate(replayed) if flag]
        if not rows:
            return
        decode = self.processing_class.batch_decode
        prompts = decode([rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist() for i in rows])
        ids = [rollout.completion_ids[i][rollout.completion_mask[i].bool()].tolist() for i in rows]
        completions = decode(ids, skip_special_tokens=True)
        for column in ("prompt", "completion", "reward", *self.reward_funcs.names):
            table[column] = list(table[column])  # copies: the lists may be the caller's
        if "image" in table:  # the buffer keeps a replayed group's pixels, not its images: none shown
            table["image"] = [[] if flag else images for flag, images in zip(replayed, table["image"])]
        for k, i in enumerate(rows):
            table["prompt"][i], table["completion"][i] = prompts[k], completions[k]
            table["reward"][i] = float(rollout.rewards[i])
            for name in self.reward_funcs.names:
                table[name][i] = None

    def _replace_zero_std_groups(self, rollout: Rollout) -> Rollout:
        """Draw buffered groups for the global batch's zero-std groups (one draw, the same on every process), then
        hand the local batch to `update_with_replay_buffer` (TRL's method: an override decides what is trained)."""
        G = self.num_generations
        zero = algos.zero_std_groups(rollout.rewards, G, self.args.replay_zero_std_atol)
        all_zero = self.accelerator.gather(zero)  # same decisions on every rank
        self.replay_buffer.evict_stale(self.state.global_step)
        picks = self.replay_buffer.sample(num_samples=int(all_zero.sum()))
        # Slot s of the global zero-std list gets picks[s]; this process owns a contiguous range of slots.
        first_slot = int(all_zero[: self.accelerator.process_index * zero.numel()].sum())
        self._pending_picks = picks[first_slot : first_slot + int(zero.sum())]
        self._replay_assignment = {}
        std = algos.group_std(rollout.rewards, G).nan_to_num(0.0).masked_fill(zero, 0.0)
        try:
            out = self.update_with_replay_buffer(
                rollout.advantages.view(-1, G),
                std.unsqueeze(1).expand(-1, G),
                rollout.prompt_ids,
                rollout.prompt_mask,
                rollout.completion_ids,
                rollout.completion_mask,
                {},
                int(rollout.completion_mask.sum()),
                rollout.old_logps,
                rollout.ref_logps,
                None,
            )
            assignment = self._replay_assignment
        finally:
            self._pending_picks, self._replay_assignment = None, None
        self._log_replacement(all_zero, picks)
        return rollout if out is None else self._rollout_from_update(out, rollout, assignment)

    def _append_buffered_groups(self, rollout: Rollout) -> Rollout:
        """Fresh-anchored replay (arXiv 2606.04560): every fresh group stays in the batch and each zero-std group of
        the global batch earns one buffered group (`replay_unit="rollout"`: G buffered rollouts drawn across the
        buffer, `_append_buffered_rollouts`), appended to the rows of the process that owns the zero-std group.
        Appended rows keep the batch divisible into groups of G and into `steps_per_generation` micro-batches: a
        process's count is rounded down to a multiple of lcm(G, steps_per_generation) rows."""
        G = self.num_generations
        zero = algos.zero_std_groups(rollout.rewards, G, self.args.replay_zero_std_atol)
        all_zero = self.accelerator.gather(zero)  # same decisions on every rank
        self.replay_buffer.evict_stale(self.state.global_step)
        if getattr(self.args, "replay_unit", "group") == "rollout":
            return self._append_buffered_rollouts(rollout, all_zero)
        picks, local = self._draw_shares(all_zero, len(self.replay_buffer) * G, G, self.replay_buffer.sample)
        self._log_replacement(all_zero, picks, appended=True)
        if not local:
            return rollout
        groups = [self._as_replayed(p.rollout, rollout) for p in local]
        return Rollout.concat([rollout, *groups], pad_token_id=self.generation_config.pad_token_id)

    def _append_buffered_rollouts(self, rollout: Rollout, all_zero: Tensor) -> Rollout:
        """Rollout-level replay: each zero-std group earns G rollouts drawn across the whole buffer with probability
        proportional to `replay_rollout_priority` (one draw, the same on every process). The appended rows keep
        their stored advantages and behaviour log-probs; every G of them follow the fresh groups as a replayed
        pseudo-group, never stored again. Whole pseudo-groups keep the trained batch a multiple of G rows (code that
        views advantages as (-1, G) keeps working), so replay starts once the buffer holds G such rollouts."""
        priority = self.args.replay_rollout_priority
        available = self.replay_buffer.num_rollouts(priority)
        picks, local = self._draw_shares(
            all_zero, available, 1, lambda n: self.replay_buffer.sample_rollouts(n, priority)
        )
        self._log_replacement(all_zero, [g for g, _ in picks], appended=True, rows=len(picks))
        if not local:
            return rollout
        rows = [self._as_replayed(g.rollout.rows(slice(i, i + 1)), rollout) for g, i in local]
        return Rollout.concat([rollout, *rows], pad_token_id=self.generation_config.pad_token_id)

    def _draw_shares(self, all_zero: Tensor, available: int, size: int, draw) -> tuple[list, list]:
        """(every pick, this process's picks) of a draw of items of `size` rows (a group: G, a rollout: 1): each
        process's zero-std groups ask for G rows each, at most `available` rows in all, each share rounded down to
        whole lcm(G, steps_per_generation) rows (the batch still splits into groups and equal micro-batches); one
        `draw(number of items)` serves all processes in rank order."""
        unit = math.lcm(self.num_generations, self.args.steps_per_generation)
        shares = []
        for n_zero in all_zero.view(self.accelerator.num_processes, -1).sum(1).tolist():
            take = min(int(n_zero) * self.num_generations, available)
            shares.append((take - take % unit) // size)
            available -= shares[-1] * size
        picks = draw(sum(shares)) if sum(shares) else []
        first = sum(shares[: self.accelerator.process_index])
        return picks, picks[first : first + shares[self.accelerator.process_index]]

    def _rollout_from_update(self, out: dict, rollout: Rollout, assignment: dict) -> Rollout:
        """The Rollout that `update_with_replay_buffer`'s dict describes. Per-row fields the dict lacks (rewards,
        policy version, ...) come from the buffered group a slot received (`assignment`), else from the fresh row;
        a row whose tokens the method changed without an assignment (an override) is flagged replayed."""
        G = self.num_generations
        groups = []
        for g in range(rollout.num_rows // G):
            if g in assignment:
                groups.append(self._as_replayed(assignment[g].rollout, rollout))
            else:
                groups.append(rollout.rows(slice(g * G, (g + 1) * G)))
        pad = self.generation_config.pad_token_id
        base = Rollout.concat(groups, pad_token_id=pad) if assignment else rollout
        new = {
            "prompt_ids": out["prompt_ids"],
            "prompt_mask": out["prompt_mask"],
            "completion_ids": out["completion_ids"],
            "completion_mask": out["completion_mask"],
            "advantages": out["advantages"].reshape(-1).to(rollout.advantages.dtype),
            "old_logps": out.get("old_per_token_logps"),
            "ref_logps": out.get("ref_per_token_logps", base.ref_logps),
        }
        changed = _changed_rows(base, new)
        new["replayed"] = base.replayed | changed
        width = new["completion_ids"].shape[1]
        for name in ("engine_logps", "tool_mask", "loss_weights"):
            value = getattr(base, name)
            new[name] = value if value is None or value.shape[1] == width else None
        if rollout.ref_logps is not None and new["ref_logps"] is None:
            raise ValueError("update_with_replay_buffer returned no ref_per_token_logps although beta > 0.")
        return base.with_(**new)

    def _mix_successes(self, rollout: Rollout) -> Rollout:
        """ExGRPO-style: each zero-std group whose prompt has a stored success with a higher reward gets that
        success in place of its last row (docs/replay.md). Local decisions: the store is the same everywhere."""
        G, step = self.num_generations, self.state.global_step
        zero = algos.zero_std_groups(rollout.rewards, G, self.args.replay_zero_std_atol).tolist()
        groups, ages = [], []
        for g, is_zero in enumerate(zero):
            group = rollout.rows(slice(g * G, (g + 1) * G))
            key = prompt_key(group.prompt_ids[0], group.prompt_mask[0]) if is_zero else None
            stored = self.success_store.peek(key, step) if key is not None else None
            if stored is not None and float(stored.row.rewards[0]) > float(group.rewards.nan_to_num(0).max()):
                self.success_store.take(key, step)
                pad = self.generation_config.pad_token_id
                group = mix_into_group(group, stored.row, self.args.scale_rewards, pad)
                ages.append(step - stored.version)
            groups.append(group)
        counts = torch.tensor([float(len(ages)), float(sum(ages))], device=rollout.rewards.device)
        counts = self.accelerator.reduce(counts, reduction="sum").tolist()
        self._metrics["train"]["replay/rows_mixed"].append(counts[0])
        if counts[0]:
            self._metrics["train"]["replay/mix_age_mean"].append(counts[1] / counts[0])
        if not ages:
            return rollout
        return Rollout.concat(groups, pad_token_id=self.generation_config.pad_token_id)

    def _as_replayed(self, stored: Rollout, like: Rollout) -> Rollout:
        """A buffered group ready to sit in a fresh batch: on the batch's device, flagged as replayed."""
        group = stored.to(like.prompt_ids.device)
        if like.ref_logps is not None and group.ref_logps is None:
            raise RuntimeError("A buffered group lacks reference log-probs although beta > 0.")
        return group.with_(replayed=torch.ones_like(group.replayed))

    def _log_replacement(self, all_zero: Tensor, picks: list, appended: bool = False, rows: int | None = None) -> None:
        """Replay metrics of one batch. picks: the buffered groups drawn (with `rows`, the rollout-level draw: the
        group of each of its `rows` rollouts, which count as rows / G groups)."""
        m = self._metrics["train"]
        n_zero, n_groups = int(all_zero.sum()), len(picks) if rows is None else rows / self.num_generations
        m["replay/buffer_size"].append(float(len(self.replay_buffer)))
        m["replay/groups_replaced"].append(float(n_groups))
        m["replay/shortfall"].append(float(n_zero - n_groups))
        if rows is not None:
            m["replay/rollouts_appended"].append(float(rows))
        if appended:  # the zero-std groups stay in the batch, which grows by the appended groups
            m["replay/frac_zero_std_trained"].append(n_zero / (all_zero.numel() + n_groups))
        else:
            m["replay/frac_zero_std_trained"].append((n_zero - len(picks)) / all_zero.numel())
        if picks:  # the same list on every rank, so no collective is needed
            ages = [self.state.global_step - p.version for p in picks]
            m["replay/age_mean"].append(sum(ages) / len(ages))
            m["replay/age_max"].append(float(max(ages)))
            m["replay/reuse_mean"].append(sum(p.reuse for p in picks) / len(picks))
            self._replayed_uids.update(p.uid for p in picks)
            self._replays += len(picks)
        if self._replays:  # 1.0: every replay was a different group; near 0: the same few groups over and over
            m["replay/distinct_frac"].append(len(self._replayed_uids) / self._replays)

    # ------------------------------------------------------------------ store informative groups
    def _after_first_pass(self, micro_batches: list[Rollout]) -> None:
        """Fresh groups with variance enter the buffer once their behaviour log-probs are known (after their
        first loss pass). Candidates are gathered from all processes and added in rank order, so every
        process holds the same buffer."""
        if self.replay_buffer is None:
            return
        rollout = micro_batches[0] if len(micro_batches) == 1 else Rollout.concat(micro_batches)
        G = self.num_generations
        zero = algos.zero_std_groups(rollout.rewards, G, self.args.replay_zero_std_atol).tolist()
        candidates, successes = [], []
        for g, is_zero in enumerate(zero):
            group = rollout.rows(slice(g * G, (g + 1) * G))
            if is_zero or bool(group.replayed.any()):
                continue
            best = successes_of_group(group) if self.success_store is not None else None
            if best is not None:
                row = group.rows(slice(best, best + 1)).with_(loss_weights=None).trim().to("cpu")
                successes.append((prompt_key(row.prompt_ids[0], row.prompt_mask[0]), row))
            score = group_score(group.rewards.cpu(), group.advantages.cpu(), self.args.replay_score)
            stored = group.with_(loss_weights=None).trim().to("cpu")  # the buffer makes the one copy
            candidates.append((stored, score, int(group.policy_version[0])))
        for stored, score, version in _flatten(gather_object([candidates])):
            self.replay_buffer.add(stored, score, version)
        if self.success_store is not None:
            for key, row in _flatten(gather_object([successes])):
                self.success_store.add(key, row, int(row.policy_version[0]))

    # ------------------------------------------------------------------ off-policy correction
    def _behaviour_correction(self, batch: Rollout, current: Tensor, old: Tensor) -> tuple[Tensor, Tensor | None]:
        cap = getattr(self.args, "replay_importance_cap", None)
        m2 = getattr(self.args, "replay_m2_threshold", None)
        if (cap is None and m2 is None) or self.replay_buffer is None:
            return old, None
        # Fresh rows keep the PPO ratio against the policy that sampled them, clipped, also when the asynchronous
        # worker sampled them with older weights (docs/async.md): the decoupled weight min(pi/mu, cap) has no trust
        # region around mu, and on fresh rows one step stale it let the policy overshoot (sparse_long: a rising
        # reward fell from 0.72 to 0.45 on 2 of 3 seeds; clipped against mu it rose steadily to 0.9).
        replayed = batch.replayed.unsqueeze(1)
        proximal = torch.where(replayed, current, old)
        if self.args.importance_sampling_level == "sequence":  # GSPO: one truncated weight per sequence
            log_w = algos.importance_log_weights(current, old, batch.loss_weights > 0, "sequence").expand_as(old)
        else:
            log_w = current - old
        weights = torch.exp(log_w).detach()
        if cap is not None:
            weights = weights.clamp(max=cap)
        if m2 is not None:  # M2PO: drop the replayed tokens of most extreme ratio, only as many as needed
            kept = algos.second_moment_trust_mask(log_w, replayed & (batch.loss_weights > 0), m2)
            weights = weights * kept
        weights = torch.where(replayed, weights, torch.ones_like(old))
        return proximal, weights

    def _extra_loss_metrics(self, batch: Rollout, logps: Tensor, behaviour: Tensor, mask: Tensor) -> dict:
        """What replayed rows contribute to the loss (docs/metrics.md): ratio, clipped share, weight shares."""
        if self.replay_buffer is None:
            return {}
        eps = (self.args.epsilon, self.args.epsilon_high)
        decoupled = getattr(self.args, "replay_importance_cap", None) is not None
        decoupled = decoupled or getattr(self.args, "replay_m2_threshold", None) is not None
        return replay_loss_metrics(batch, logps.detach(), behaviour, mask, eps, decoupled)

    # ------------------------------------------------------------------ checkpoints
    def _extra_state(self) -> dict:
        state = super()._extra_state()
        state["replay_buffer"] = None if self.replay_buffer is None else self.replay_buffer.state_dict()
        state["success_store"] = None if self.success_store is None else self.success_store.state_dict()
        state["replay_counts"] = {"uids": sorted(self._replayed_uids), "replays": self._replays}
        return state

    def _load_extra_state(self, state: dict) -> None:
        super()._load_extra_state(state)
        if self.replay_buffer is not None and state.get("replay_buffer") is not None:
            self.replay_buffer.load_state_dict(state["replay_buffer"])
            # the run's settings rule: a changed size keeps the highest-scored groups (see _adapt_settings)
            args = self.args
            self.replay_buffer.reconfigure(args.replay_buffer_size, args.replay_max_age, args.replay_max_reuse)
        if self.success_store is not None and state.get("success_store") is not None:
            self.success_store.load_state_dict(state["success_store"])
        counts = state.get("replay_counts") or {"uids": [], "replays": 0}
        self._replayed_uids, self._replays = set(counts["uids"]), counts["replays"]

    adaptable_settings = frozenset({"replay_buffer_size"})

    def _checkpoint_settings(self) -> dict:
        return {**super()._checkpoint_settings(), "replay_buffer_size": self.args.replay_buffer_size}

    def _adapt_settings(self, saved: dict) -> None:
        if "replay_buffer_size" in saved:
            logger.warning(
                f"Resuming with replay_buffer_size={self.args.replay_buffer_size} (the checkpoint used "
                f"{saved['replay_buffer_size']}): the buffer keeps its highest-scored groups up to the new size."
            )


def _changed_rows(base: Rollout, new: dict) -> Tensor:
    """(N,) bool: rows whose real prompt or completion tokens differ between `base` and `new`'s tensors."""
    pairs = (("prompt_ids", "prompt_mask"), ("completion_ids", "completion_mask"))
    rows = []
    for i in range(base.num_rows):
        before = [getattr(base, ids)[i][getattr(base, mask)[i].bool()] for ids, mask in pairs]
        after = [new[ids][i][new[mask][i].bool()] for ids, mask in pairs]
        rows.append(any(b.shape != a.shape or not torch.equal(b, a) for b, a in zip(before, after)))
    return torch.tensor(rows, dtype=torch.bool, device=base.replayed.device)


def _flatten(per_rank: list[list]) -> list:
    return [item for items in per_rank for item in items]
