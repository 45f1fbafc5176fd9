"""MC-MLM fine-tuning (the paper's learning curves) through the workbench's one training loop."""

from __future__ import annotations

import copy

import numpy as np
import torch

from probes.cloze.scoring import contexts_of
from workbench.errors import ConfigError
from workbench.running.lm_scores import LMScorer, filled_items, mlm_head
from workbench.loop import (NO_HOOKS, TrainingHooks, adamw, apply_param_filter, evaluating, loss_terms, optimizer_step,
                            prepare_teacher)


# --------------------------------------------------------------------------- fine-tuning (MC-MLM)


class MCHead:
    """The multiple-choice head of Talmor et al. (2020) as a differentiable scorer: masked LMs
    score a candidate by its log-probability at the mask (several pieces: all masked at once,
    log-probs summed; the paper's choice for fine-tuning), causal LMs by the filled sentence's
    log-likelihood. Encodings are made once with the scorer's tokenisation; candidates whose
    masked inputs are identical (same number of pieces) share one row."""

    def __init__(self, scorer: LMScorer, items):
        if scorer.kind not in ("mlm", "causal"):
            raise ConfigError(f"fine-tuning the MC head is provided for masked and causal LMs, not {scorer.kind!r}")
        self.kind = scorer.kind
        self.pad = scorer.pad
        self.head = mlm_head(scorer.model) if self.kind == "mlm" else None
        self.answers = torch.tensor([it.answer for it in items])
        self.k = len(items[0].choices) if items else 0
        self.rows = []  # per item: list of unique row ids
        self.queries = []  # per item: list of (row within item, position, target, candidate)
        ctx, cands, _ = contexts_of(items)
        per_item = [[] for _ in items]
        for it in filled_items(ctx, cands):
            per_item[it[0]].append(it)
        for i, filled in enumerate(per_item):
            rows, queries, seen = [], [], {}
            for j, it in enumerate(filled):
                ids, special, pos = scorer.encode_filled(*it)
                if self.kind == "mlm":
                    row = ids.copy()
                    row[pos] = scorer.mask_id
                    tgt_pos, tgt = pos, ids[pos]
                else:
                    row = scorer.causal_row(ids, special, f"item {i}")
                    tgt_pos, tgt = np.arange(len(row) - 1), row[1:]  # logits at t predict t+1
                key = row.tobytes()
                if key not in seen:
                    seen[key] = len(rows)
                    rows.append(row)
                queries += [(seen[key], int(p), int(t), j) for p, t in zip(tgt_pos, tgt)]
            self.rows.append(rows)
            self.queries.append(np.array(queries, dtype=np.int64))

    def scores(self, model, index) -> torch.Tensor:
        """[B, K] candidate scores of items `index` (with gradients)."""
        rows, q = [], []
        for b, i in enumerate(index):
            qi = self.queries[i].copy()
            qi[:, 0] += len(rows)
            q.append(np.column_stack([qi, np.full(len(qi), b)]))
            rows += self.rows[i]
        q = np.concatenate(q)
        ids, att = self.pad(rows)
        dev = ids.device
        r, p, t = (torch.as_tensor(q[:, c], device=dev) for c in range(3))
        if self.head is not None:  # the head at the queried positions only
            hidden = model.base_model(input_ids=ids, attention_mask=att, return_dict=True).last_hidden_state
            logits = self.head(model, hidden[r, p])
        else:
            logits = model(input_ids=ids, attention_mask=att, return_dict=True).logits[r, p]
        lp = torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0]
        flat = torch.as_tensor(q[:, 4] * self.k + q[:, 3], device=dev)
        out = torch.zeros(len(index) * self.k, device=dev, dtype=lp.dtype).index_add(0, flat, lp)
        return out.view(len(index), self.k)


def finetune_mc(scorer: LMScorer, train_items, eval_items, *, steps: int = 200, lr: float = 1e-4,
                batch_size: int = 16, seed: int = 0, eval_batch: int = 64, hooks: TrainingHooks | None = None) -> dict:
    """Fine-tune a copy of the LM (all weights, AdamW, constant lr) on the MC objective
    (cross-entropy over the candidate scores) for `steps` updates of `batch_size` items drawn
    with replacement from `train_items`; returns {"accuracy", "train_loss"} on `eval_items`, and
    which parameters trained ("trainable").

    The step is the workbench's shared one (`workbench.loop`): `hooks` may add an after-step hook,
    a parameter filter, or a teacher (scored with the same MC head) and a loss
    `loss(student_scores, item_indices, teacher_scores)`; then "train_terms" holds the mean of
    every term over the last 20 steps."""
    hooks = hooks or NO_HOOKS
    train, evals = MCHead(scorer, train_items), MCHead(scorer, eval_items)

    def mc_loss(scores, index) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(scores, train.answers[index].to(scores.device))}

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = copy.deepcopy(scorer.model).train()
        trainable = apply_param_filter(model, hooks.trainable)
        opt = adamw(model.named_parameters(), lr, weight_decay=0.0)
        prepare_teacher(hooks, model.device)
        gen = torch.Generator().manual_seed(seed)
        steps_terms = []
        for step in range(steps):
            idx = torch.randint(len(train_items), (batch_size,), generator=gen).tolist()
            terms = loss_terms(model, idx, hooks, mc_loss, forward=train.scores)
            terms["loss"].backward()
            optimizer_step(model, opt, None, 0.0, hooks, step + 1)
            steps_terms.append({k: float(v.detach()) for k, v in terms.items()})
        with evaluating(model):
            pred = torch.cat([train_scores.argmax(1).cpu() for train_scores in
                              (evals.scores(model, list(range(b, min(b + eval_batch, len(eval_items)))))
                               for b in range(0, len(eval_items), eval_batch))])
    acc = float((pred == evals.answers).float().mean())
    last = steps_terms[-20:]
    out = {"accuracy": acc, "train_loss": float(np.mean([t["loss"] for t in last])) if last else float("nan"),
           "trainable": trainable}
    if hooks.loss is not None and last:
        out["train_terms"] = {k: float(np.mean([t[k] for t in last])) for k in last[0]}
    return out


def weighted_score(sizes, accuracies) -> float:
    """One number per learning curve that emphasises small training sizes (in the spirit of the
    paper's WS): the mean accuracy with weights falling linearly from the smallest size (weight
    K) to the largest (weight 1) over the K sizes, sizes taken in increasing order."""
    order = np.argsort(sizes)
    w = np.arange(len(order), 0, -1, dtype=np.float64)
    return float(np.sum(w * np.asarray(accuracies, dtype=np.float64)[order]) / w.sum())
