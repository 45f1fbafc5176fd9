"""The one pretraining loop every family uses (read top to bottom: data, model, step, checkpoint).

`train_from_config("experiments/train/bert_small.yaml")` trains one model per seed and returns the
final checkpoint folder of each. What a step does:

1. Data: the corpus (`workbench.data.corpus.build_corpus`, cached by its settings) -> the family's
   tokenizer trained on the TRAIN split (`workbench.tokenization`) -> a memory-mapped tokenised
   corpus (`workbench.data_cache.TokenizedCorpus`). Each epoch, `family.make_examples(corpus,
   max_len, rng)` yields the example stream with `rng` seeded from (seed, epoch); example i of a
   global micro-batch goes to DDP rank i % world_size; the family's collator turns the rank's
   examples into tensors with a `torch.Generator` seeded from (seed, micro-step, rank), so masks are
   dynamic (Liu et al. 2019) and reproducible. With `seq_len_warmup` the examples of step t are
   first cut to `cfg.seq_len_at(t)` tokens (`family.truncate_example`; Li, Zhang & He 2022).
   Each step's batches are a pure function of the data position, seed and step (`step_batches`):
   built in this process on a CPU, ahead in one worker process on a GPU (`host_batches`), where the
   host's batch building would otherwise leave the GPU idle.
2. Step: forward under bf16 autocast where `precision` resolves to bf16 (CUDA by default; CPUs with
   native bf16 under `precision: auto`, workbench/precision.py), loss / grad_accum,
   backward (DDP all-reduces the gradients on the last micro-step), clip, AdamW (no weight decay
   on biases and LayerNorm weights; Loshchilov & Hutter 2019), linear warm-up then linear decay (Devlin et al. 2019).
3. Log: one JSON line per step in `log.jsonl` (step, non-padding tokens seen, lr, each loss term,
   elapsed seconds; held-out loss at checkpoints), written once the next step is queued (reading a
   loss waits for the device) and at once before a checkpoint.
4. Checkpoint at steps 0, 1, 2, 4, 8, ... (+ every N, + the last): `step-NNNNNNN/` holds a plain
   `save_pretrained` folder, the tokenizer, `manifest.json`, and (at the latest checkpoint only)
   `trainer_state/` with everything needed for an exact resume: the full training module's weights,
   optimizer, scheduler, RNG states of torch/numpy/python per rank, data position (epoch, batch),
   step and tokens seen; all loadable with `torch.load(..., weights_only=True)`.

Hooks: `train_from_config(..., hooks=TrainingHooks(...))` adds an after-step hook (re-apply
pruning masks, rewind), a teacher whose outputs the loss reads (every term of the loss is logged)
or a filter of which parameters train; the step, the optimizer and the checkpoint folder are the
pieces of `workbench.loop`, which fine-tuning and the cloze probe's MC fine-tuning share.

Resume: running the same config again continues from the latest checkpoint; on CPU the final
weights equal an uninterrupted run's bit for bit (tests/test_train_resume.py).
Distributed: launch with `torchrun --nproc_per_node N -m workbench.drivers.train CONFIG.yaml`; `batch_size`
is the GLOBAL micro-batch, so a config means the same optimisation at any world size.

Concerns:
- the schedule's checks: `checkpoint_steps`, `check_seq_len_warmup`
- torchrun (ranks, this rank's device): `Dist`, `init_distributed`
- data (corpus, tokenizer, the step batches a pure function of position, seed and step):
  `TrainingData`, `corpus_dir_for`, `prepare_data`, `example_batches`, `DataPosition`, `StepBatch`,
  `step_batches`, `host_batches`, `count_tokens`
- the model, the optimizer and the objective: `build_optimizer`, `objective_settings`, `build_model`,
  `pretraining_loss`, `evaluate_heldout`
- checkpoints, the run folder and what they record: `save_checkpoint`, `load_trainer_state`,
  `run_dir`, `claim_run_folder`, `dropout_record`, `precision_record`, `checkpoint_manifest`,
  `pretraining_cost_meter`, `read_log`
- the loop over seeds and the driver (`bertology train`): `train_seed`, `train_from_config`,
  `train_units`, `train_seed_unit`, `load_driver_config`, `report`, `train_cli_main`
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import transformers

from workbench.store.checkpoints import STEP_PREFIX, list_steps, seed_dir, step_dir
from workbench.config import TrainConfig, load_train_config
from workbench.data_cache import TokenizedCorpus
from workbench.drivers.executor import Unit, UnitPlan, resolve_options, run_plan
from workbench.drivers.spec import DriverSpec
from workbench.dropout import use_fast_attention_dropout, use_fast_dropout
from workbench.errors import CheckpointError, ConfigError
from workbench.families import get_family
from workbench.families.base import FamilySpec
from workbench.store.identity import tokenizer_hash
from workbench.io import atomic_dir, atomic_write_json, atomic_write_text
from workbench.loop import (
    NO_HOOKS,
    TrainingHooks,
    adamw,
    apply_param_filter,
    count_trainable,
    evaluating,
    linear_warmup_decay,
    loss_terms,
    optimizer_step,
    prepare_teacher,
    write_model_folder,
)
from workbench.paths import cache_root, runs_root
from workbench.precision import PRECISIONS, resolve_device
from workbench.precision import autocast as precision_autocast
from workbench.progress import is_quiet, progress
from workbench.tokenization import reuse_tokenizer, train_tokenizer

STATE_DIR = "trainer_state"
# What the `--family F --preset P` shortcut trains when no config file is given. `small` is the
# CPU recipe measured in docs/evidence/training-plateau.md: batches of 16 x 128 at lr 1e-3 (small updates
# leave the unigram plateau soonest per token on 2 cores), 1,200 updates (2.46M tokens: the GPT's
# 32 minutes at about one core's share in the README's main job); masked LMs without NSP (Liu et al. 2019).
PRESET_RECIPES = {
    "tiny": {"steps": 200},
    "small": {"steps": 1200, "batch_size": 16, "max_len": 128, "lr": 1.0e-3, "warmup": 100},
    "base": {"steps": 100_000},
}


# ---- schedule -----------------------------------------------------------------------------------


def checkpoint_steps(total_steps: int, every: int | None = None, log_spaced: bool = True) -> list[int]:
    """0, 1, 2, 4, 8, ... (< total), plus every `every` steps, plus the last step; sorted, unique."""
    steps = {0, total_steps}
    if log_spaced:
        p = 1
        while p < total_steps:
            steps.add(p)
            p *= 2
    if every:
        steps.update(range(every, total_steps, every))
    return sorted(steps)


lr_lambda_factory = linear_warmup_decay  # linear warm-up, then linear decay (workbench.loop)


def check_seq_len_warmup(cfg: TrainConfig, family: FamilySpec) -> None:
    """ConfigError unless the family can train on truncated examples (`seq_len_warmup` is set)."""
    if cfg.seq_len_warmup is not None and family.truncate_example is None:
        raise ConfigError(
            f"{cfg.source}: seq_len_warmup: family {family.name} does not support it (cutting its examples "
            f"would change its objective; families with plain token blocks or sentence pairs do)")


def _mix_seed(*parts: int) -> int:
    """A 63-bit seed from several integers (stable across processes, unlike hash())."""
    h = hashlib.sha256(",".join(str(int(p)) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


# ---- distributed ----------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def device(self, name: str) -> torch.device:
        """This process's device for a config's `device` (`workbench.precision.resolve_device`):
        under torchrun (world > 1) a bare "cuda" or "auto" on CUDA is this rank's GPU."""
        return resolve_device(name, self.local_rank if self.world > 1 else None)


def init_distributed(device: str) -> Dist:
    """Join the torchrun process group (gloo on CPU, nccl on CUDA); a plain run is rank 0 of 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))


# ---- data -----------------------------------------------------------------------------------------


@dataclass
class TrainingData:
    corpus: object  # workbench.data.corpus.CorpusSplit
    tokenizer: object  # PreTrainedTokenizerFast
    train: TokenizedCorpus
    heldout: TokenizedCorpus


def corpus_dir_for(cfg: TrainConfig) -> Path:
    c = cfg.corpus
    key = {"sources": c.sources, "heldout_fraction": c.heldout_fraction, "seed": c.seed, "max_documents": c.max_documents}
    if c.recipe != 1:  # recipe 1 corpora keep the cache folders they always had
        key["recipe"] = c.recipe
    if c.canaries is not None:  # so do corpora without canaries
        key["canaries"] = c.canaries
    key = json.dumps(key, sort_keys=True)
    return cache_root() / "corpus" / hashlib.sha256(key.encode()).hexdigest()[:20]


def prepare_data(cfg: TrainConfig, family: FamilySpec, d: Dist | None = None) -> TrainingData:
    """Corpus split, tokenizer and tokenised train/held-out corpora, each built once and cached.

    Under DDP rank 0 builds and the other ranks wait, then load the same cache folders.
    """
    from workbench.data.corpus import CorpusSplit, build_corpus

    d = d or Dist()
    show = cfg.progress and d.main and not is_quiet()  # also the tokenizers library's own (Rust) bar

    def build():
        out = corpus_dir_for(cfg)
        if (out / "manifest.json").exists():
            corpus = CorpusSplit.load(out)
        else:  # build_corpus writes atomically
            corpus = build_corpus(cfg.corpus.sources, out, heldout_fraction=cfg.corpus.heldout_fraction,
                                  seed=cfg.corpus.seed, max_documents=cfg.corpus.max_documents,
                                  recipe=cfg.corpus.recipe, canaries=cfg.corpus.canaries)
        if cfg.tokenizer.path:
            tok = reuse_tokenizer(family, cfg.tokenizer.path, cfg.tokenizer.vocab_size)
        else:
            tok = train_tokenizer(family, corpus, cfg.tokenizer.vocab_size, show_progress=show)
        train = TokenizedCorpus.build(tok, corpus, "train", show_progress=show)
        heldout = TokenizedCorpus.build(tok, corpus, "heldout", show_progress=show)
        return TrainingData(corpus, tok, train, heldout)

    if d.main:
        data = build()
        d.barrier()
    else:
        d.barrier()
        data = build()  # every piece is cached by now: only loads
    return data


def example_batches(
    family: FamilySpec, corpus: TokenizedCorpus, cfg: TrainConfig, seed: int, epoch: int, d: Dist
) -> Iterator[tuple[int, list]]:
    """(batch index, this rank's examples) for one epoch; the last incomplete batch is dropped."""
    rng = np.random.default_rng(_mix_seed(seed, epoch, 0xE70C))
    batch: list = []
    index = 0
    for example in family.examples(corpus, cfg.max_len, rng, objective_settings(cfg, family)):
        batch.append(example)
        if len(batch) == cfg.batch_size:
            yield index, batch[d.rank :: d.world]
            batch = []
            index += 1


class DataPosition:
    """An endless micro-batch stream over epochs that knows where it is (epoch, next batch index)."""

    def __init__(self, family, corpus, cfg, seed, d, epoch=0, batch_index=0):
        self.family, self.corpus, self.cfg, self.seed, self.d = family, corpus, cfg, seed, d
        self.epoch, self.batch_index = epoch, batch_index
        self._it = self._open(skip=batch_index)

    def _open(self, skip: int):
        it = example_batches(self.family, self.corpus, self.cfg, self.seed, self.epoch, self.d)
        for _ in range(skip):  # exact resume: regenerate the epoch's stream, skip what was seen
            if next(it, None) is None:
                break
        return it

    def next(self) -> list:
        for _ in range(2):
            item = next(self._it, None)
            if item is not None:
                self.batch_index = item[0] + 1
                return item[1]
            self.epoch, self.batch_index = self.epoch + 1, 0
            self._it = self._open(skip=0)
        raise ConfigError(
            f"{self.cfg.source}: batch_size: the training split yields no full batch of {self.cfg.batch_size} "
            f"examples of max_len {self.cfg.max_len} (corpus too small?)"
        )


@dataclass
class StepBatch:
    """One optimizer step's input, built on the host: its micro-batches (CPU tensors), their
    non-padding tokens, and the data position after them (what a checkpoint at this step records)."""

    step: int
    seq_len: int
    micro: list[dict]
    tokens: int
    epoch: int
    batch_index: int

    def pin_memory(self) -> "StepBatch":
        """Page-locked copies (DataLoader's pin_memory thread calls this): host-to-GPU copies
        that do not block the host."""
        return dataclasses.replace(self, micro=[{k: v.pin_memory() for k, v in b.items()} for b in self.micro])


def step_batches(family: FamilySpec, corpus: TokenizedCorpus, cfg: TrainConfig, seed: int, d: Dist, collate, tok,
                 epoch: int, batch_index: int, start_step: int, total: int) -> Iterator[StepBatch]:
    """The batches of steps `start_step`..`total` - 1 from data position (epoch, batch_index): the
    examples of `DataPosition`, sequence-length warm-up truncation and the collator's masking, each
    drawn from a generator seeded by (seed, step, micro-batch, rank), so the stream is a pure function
    of where it starts and can be built anywhere (in this process, or ahead in a worker)."""
    position = DataPosition(family, corpus, cfg, seed, d, epoch, batch_index)
    for step in range(start_step, total):
        seq_len = cfg.seq_len_at(step)
        micro, tokens = [], 0
        for m in range(cfg.grad_accum):
            examples = position.next()
            if seq_len < cfg.max_len:  # sequence-length warm-up: a pure function of the step
                gt = torch.Generator().manual_seed(_mix_seed(seed, step * cfg.grad_accum + m, d.rank, 0x51E))
                examples = [family.truncate_example(ex, seq_len, tok, gt) for ex in examples]
            g = torch.Generator().manual_seed(_mix_seed(seed, step * cfg.grad_accum + m, d.rank))
            batch = collate(examples, g)
            tokens += count_tokens(batch)
            micro.append(batch)
        yield StepBatch(step, seq_len, micro, tokens, position.epoch, position.batch_index)


class _StepBatchStream(torch.utils.data.IterableDataset):
    def __init__(self, make: Callable[[], Iterator[StepBatch]]):
        self.make = make

    def __iter__(self) -> Iterator[StepBatch]:
        return self.make()


def _one_thread(_worker_id: int) -> None:
    torch.set_num_threads(1)


@contextlib.contextmanager
def host_batches(make: Callable[[], Iterator[StepBatch]], worker: bool) -> Iterator[Iterator[StepBatch]]:
    """The step batches of `make()`, in this process (`worker=False`: on a CPU every core is the
    model's) or built ahead in one worker process and handed over page-locked (`worker=True`: the
    training loop's choice on a GPU, where building a BERT-base batch of 64 x 128 costs the host
    30-45 ms a step, as much as the GPU's whole step; benchmarks/bench_gpu.py --profile-steps). The
    worker gets its own seeded generator, so the main process' RNG streams (dropout, saved in every
    checkpoint) are untouched and a resumed run draws what an uninterrupted one draws."""
    if not worker:
        stream = make()
        try:
            yield stream
        finally:
            stream.close()
        return
    loader = torch.utils.data.DataLoader(_StepBatchStream(make), batch_size=None, num_workers=1, prefetch_factor=4,
                                         pin_memory=torch.cuda.is_available(), worker_init_fn=_one_thread,
                                         generator=torch.Generator().manual_seed(0))
    stream = iter(loader)
    try:
        yield stream
    finally:
        stream._shutdown_workers()


def count_tokens(batch: dict) -> int:
    """Non-padding input tokens of a batch (attention mask when there is one)."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return int(batch["input_ids"].numel())


# ---- model and optimiser -------------------------------------------------------------------------


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """`workbench.loop.adamw` over the parameters in name order, with the config's settings."""
    return adamw(sorted(model.named_parameters(), key=lambda kv: kv[0]), cfg.lr, cfg.weight_decay,
                 betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def evaluate_heldout(model, family: FamilySpec, heldout: TokenizedCorpus, tokenizer, cfg: TrainConfig,
                     n_batches: int, device, seed: int = 1234) -> dict[str, float]:
    """Mean loss (and loss terms) on a FIXED set of held-out batches: same examples and same masks
    every time it is called, so values at different steps compare."""
    model = _unwrap(model)
    collate = family.make_collator(objective_settings(cfg, family), tokenizer)
    rng = np.random.default_rng(seed)
    examples = []
    for ex in family.examples(heldout, cfg.max_len, rng, objective_settings(cfg, family)):
        examples.append(ex)
        if len(examples) == n_batches * cfg.batch_size:
            break
    sums: dict[str, float] = {}
    n = 0
    with evaluating(model):
        for b in range(0, len(examples) - cfg.batch_size + 1, cfg.batch_size):
            g = torch.Generator().manual_seed(_mix_seed(seed, b))
            batch = {k: v.to(device) for k, v in collate(examples[b : b + cfg.batch_size], g).items()}
            with _autocast(cfg, device):
                out = model(**batch)
            sums["loss"] = sums.get("loss", 0.0) + float(out.loss)
            for k, v in out.loss_terms.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
    if n == 0:
        raise ConfigError(f"{cfg.source}: the held-out split yields no full batch of {cfg.batch_size} examples")
    return {k: v / n for k, v in sums.items()}


def _autocast(cfg: TrainConfig, device: torch.device):
    """bf16 autocast where the config's precision resolves to bf16 on `device` (workbench/precision.py)."""
    return precision_autocast(cfg.resolved_precision(str(device))[0], device)


def objective_settings(cfg: TrainConfig, family: FamilySpec) -> dict:
    """The family's objective defaults with the config's `objective:` on top, plus max_len."""
    return {**family.objective, **cfg.objective, "max_len": cfg.max_len}


# ---- checkpoints ----------------------------------------------------------------------------------


# The step folder layout (`step_dir`) and listing a run's steps live in workbench/store/checkpoints.py.
list_checkpoints = list_steps  # (step, folder) of a run folder's complete checkpoints, by step


def _rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def _gather(obj, d: Dist) -> list:
    if d.world == 1:
        return [obj]
    out = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def save_checkpoint(out: Path, step: int, model, optimizer, scheduler, position: tuple[int, int], tokens_seen: int,
                    elapsed: float, manifest: dict, tokenizer, d: Dist, heldout: dict | None) -> Path:
    """Write `step-NNNNNNN/` atomically (rank 0), then drop the previous checkpoint's trainer_state.
    `position`: the data stream's (epoch, next batch index) after `step`."""
    rng_states = _gather(_rng_state(), d)  # every rank takes part; rank 0 writes
    path = step_dir(out, step)
    if d.main:
        raw = _unwrap(model)
        with atomic_dir(path) as tmp:
            write_model_folder(tmp, raw, tokenizer, {**manifest, "step": step, "tokens_seen": tokens_seen,
                                                     "heldout": heldout, "elapsed_seconds": round(elapsed, 3)})
            state = tmp / STATE_DIR
            state.mkdir()
            torch.save({k: v for k, v in raw.state_dict().items()}, state / "model.pt")
            torch.save(optimizer.state_dict(), state / "optimizer.pt")
            torch.save({
                "scheduler": scheduler.state_dict(),
                "step": step,
                "epoch": position[0],
                "batch_index": position[1],
                "tokens_seen": tokens_seen,
                "elapsed": elapsed,
                "world_size": d.world,
                "rng": rng_states,
            }, state / "state.pt")
        for s, p in list_checkpoints(out):
            if s != step and (p / STATE_DIR).exists():
                shutil.rmtree(p / STATE_DIR, ignore_errors=True)
    d.barrier()
    return path


def load_trainer_state(path: Path) -> tuple[dict, dict, dict]:
    """(model state dict, optimizer state dict, loop state) of a checkpoint, weights_only."""
    state = path / STATE_DIR
    try:
        return (torch.load(state / "model.pt", weights_only=True, map_location="cpu"),
                torch.load(state / "optimizer.pt", weights_only=True, map_location="cpu"),
                torch.load(state / "state.pt", weights_only=True, map_location="cpu"))
    except (OSError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"{state}: cannot load the trainer state: {exc}") from exc


def _repair_log(log_path: Path, up_to_step: int) -> None:
    """Keep the log lines of steps <= `up_to_step` (a killed run may have logged further or half a line)."""
    if not log_path.exists():
        return
    keep = []
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step", 0) <= up_to_step:
            keep.append(line)
    atomic_write_text(log_path, "".join(k + "\n" for k in keep))


# ---- the loop -------------------------------------------------------------------------------------


def run_dir(cfg: TrainConfig, seed: int) -> Path:
    base = Path(cfg.output_dir) if cfg.output_dir else runs_root() / "train" / cfg.name
    return seed_dir(base, seed)


def train_seed(cfg: TrainConfig, seed: int, data: TrainingData | None = None, d: Dist | None = None,
               hooks: TrainingHooks | None = None) -> Path:
    """Train (or resume, or find finished) one seed's run; returns its final checkpoint folder.

    `hooks` (`workbench.loop.TrainingHooks`: an after-step hook, a teacher and the loss that reads
    it, a parameter filter) are recorded in run.json and in every checkpoint's manifest; a run
    folder made with other hooks is refused, like one made with another config.
    torch's process-wide determinism switches are restored afterwards (the loop sets them).
    """
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    try:
        return _train_seed(cfg, seed, data, d, hooks or NO_HOOKS)
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling


def claim_run_folder(cfg: TrainConfig, seed: int, out: Path, d: Dist, hooks: TrainingHooks,
                     device: torch.device | None = None) -> None:
    """A run folder belongs to one config and one set of hooks: refuse to mix runs (run.json). The
    training hash counts the precision as resolved on `device` (default: the config's `device`)."""
    run_json = out / "run.json"
    where = str(device) if device is not None else None
    if run_json.exists():
        prev = json.loads(run_json.read_text())
        if prev["training_hash"] != cfg.training_hash(where):
            if cfg.dropout_masks == "pcg16" and prev["training_hash"] == dataclasses.replace(
                    cfg, dropout_masks="bernoulli").training_hash(where):
                raise ConfigError(f"{cfg.source}: output folder {out} holds a run trained with torch's bernoulli dropout "
                                  f"masks (before dropout_masks: pcg16 became the default); add `dropout_masks: "
                                  f"bernoulli` to the config to reuse or resume it, or choose another name/output_dir")
            if cfg.dropout_masks == "pcg16" and prev["training_hash"] == dataclasses.replace(
                    cfg, dropout_masks="pcg16_modules").training_hash(where):
                raise ConfigError(f"{cfg.source}: output folder {out} holds a run trained with pcg16 masks for the dropout "
                                  f"modules only (attention-probability dropout by torch's bernoulli_, before "
                                  f"2026-11-27); add `dropout_masks: pcg16_modules` to the config to reuse or resume "
                                  f"it, or choose another name/output_dir")
            raise ConfigError(f"{cfg.source}: output folder {out} holds a run of a different config "
                              f"(training settings differ); choose another name/output_dir or delete it")
        if prev.get("hooks", {}) != hooks.describe():
            raise ConfigError(f"{cfg.source}: output folder {out} holds a run trained with other hooks "
                              f"({prev.get('hooks', {})}, now {hooks.describe()}); choose another name/output_dir")
    elif d.main:
        record = {"training_hash": cfg.training_hash(where), "config": cfg.to_dict(), "seed": seed,
                  "precision": precision_record(cfg, where), "dropout_masks": dropout_record(cfg)}
        if hooks.describe():
            record["hooks"] = hooks.describe()
        atomic_write_json(run_json, record)


def build_model(cfg: TrainConfig, family: FamilySpec, tokenizer, seed: int, device) -> torch.nn.Module:
    """The family's training module with the seed's initial weights (the same on every rank)."""
    torch.manual_seed(_mix_seed(seed, 0x1417))
    model = family.build_model(family.model_config(cfg.preset, cfg.model), tokenizer).to(device)
    if cfg.dropout_masks in ("pcg16", "pcg16_modules"):  # cheaper CPU masks, same dropout (workbench/dropout.py)
        use_fast_dropout(model)
    if cfg.dropout_masks == "pcg16" and torch.device(device).type == "cpu":  # and the attention probabilities'
        use_fast_attention_dropout(model)  # (elsewhere the masks are torch's anyway: keep SDPA's fused kernels)
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if max_pos is not None and max_pos < cfg.max_len:
        raise ConfigError(f"{cfg.source}: max_len: {cfg.max_len} exceeds the model's {max_pos} positions")
    return model


def dropout_record(cfg: TrainConfig) -> dict:
    """How the run's CPU dropout masks are drawn, for run.json and the manifests: the config's
    `dropout_masks`, and for the attention probabilities "pcg16" (a swapped module, or the
    `bertology_pcg16` attention function), "bernoulli" (torch's), or "none" (no attention)."""
    modules = "bernoulli" if cfg.dropout_masks == "bernoulli" else "pcg16"
    kind = get_family(cfg.family).attention_dropout  # FamilySpec: "module", "functional" or None
    if kind == "module":
        attention = modules
    elif kind == "functional":
        attention = "pcg16" if cfg.dropout_masks == "pcg16" else "bernoulli"
    else:
        attention = "none"
    return {"setting": cfg.dropout_masks, "modules": modules, "attention_probabilities": attention}


def precision_record(cfg: TrainConfig, device: str | None = None) -> dict:
    """{"resolved": "fp32" | "bf16", "why": ...} for run.json and the manifests, e.g. "auto: amx_bf16 present"."""
    resolved, why = cfg.resolved_precision(device)
    return {"resolved": resolved, "why": why}


def checkpoint_manifest(cfg: TrainConfig, family: FamilySpec, data: TrainingData, seed: int, d: Dist,
                        trainable: dict, hooks: TrainingHooks, device: torch.device | None = None) -> dict:
    """What every checkpoint's manifest.json says about its run (`save_checkpoint` adds the step's
    own numbers): family, model and objective, the corpus it read, tokenizer, seed, the config,
    which parameters trained (`workbench.loop.count_trainable`) and the hooks, if any."""
    from workbench.data.corpus import corpus_recipe, corpus_reference

    manifest = {
        "family": family.name,
        "auto_class": family.auto_class,
        "preset": cfg.preset,
        "model_config": family.model_config(cfg.preset, cfg.model),
        "objective": objective_settings(cfg, family),
        "corpus": {**corpus_reference(data.corpus.dir), "split": "train",
                   "sources": cfg.corpus.sources, "heldout_fraction": cfg.corpus.heldout_fraction,
                   "seed": cfg.corpus.seed, "max_documents": cfg.corpus.max_documents,
                   "train_tokens": data.train.num_tokens},
        "corpus_recipe": corpus_recipe(data.corpus),  # rebuilds the split where the corpus folder is not found
        "tokenizer": {"kind": family.tokenizer_kind, "vocab_size": len(data.tokenizer),
                      "sha256": tokenizer_hash(data.tokenizer)},
        "seed": seed,
        "total_steps": cfg.total_steps,
        "world_size": d.world,
        "config": cfg.to_dict(),
        "precision": precision_record(cfg, str(device) if device is not None else None),
        "dropout_masks": dropout_record(cfg),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "trainable": trainable,
    }
    if hooks.describe():
        manifest["hooks"] = hooks.describe()
    return manifest


def pretraining_cost_meter(manifest: dict, device, d: Dist, resume_from: Path | None):
    """`cost(tokens_seen, elapsed)` -> the checkpoint's `cost` record (`workbench.cost`): analytic
    FLOPs of the family x tokens seen, device-hours, energy (measured, or estimated from power x
    time) and CO2e. A resumed run carries the measured energy of the checkpoint it resumed from."""
    from workbench.store.checkpoints import read_manifest
    from workbench.cost import (EnergyMeter, cost_record, device_info, manifest_kaplan_per_token, own_cost, teacher_folder,
                                training_flops_per_token)

    # the family's step, plus a distillation teacher's forwards (workbench.cost.training_flops_per_token)
    fpt = training_flops_per_token(manifest)["total"]
    kaplan = manifest_kaplan_per_token(manifest)  # Kaplan et al.'s 6N, kept beside the full count
    info = {**device_info(device), "count": d.world}
    before = ((read_manifest(resume_from) or {}).get("cost") or {}).get("own") if resume_from is not None else None
    meter = EnergyMeter(info, already_joules=(before or {}).get("energy_joules_device"))

    def cost(tokens_seen: int, elapsed: float) -> dict:
        joules, source = meter.reading()
        return cost_record(own_cost(flops=None if fpt is None else fpt * tokens_seen, flops_per_token=fpt,
                                    tokens=tokens_seen, seconds=elapsed, device=info, energy_joules=joules, energy_source=source,
                                    what=f"pretraining ({manifest['family']} {manifest['preset']})",
                                    kaplan_per_token=kaplan), None,
                           teacher=teacher_folder(manifest.get("hooks")))

    return cost


def pretraining_loss(out, batch) -> dict[str, torch.Tensor]:
    """A family's own objective: its loss, then its named parts (`PretrainingOutput`)."""
    return {"loss": out.loss, **out.loss_terms}


def _build_trainable(cfg: TrainConfig, family: FamilySpec, tok, seed: int, device: torch.device, hooks: TrainingHooks):
    """(model, optimizer, scheduler) of one seed, in this order: deterministic mode, the seeded
    model, the hooks' initial weights and trainable filter, then the optimizer over what trains."""
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        # Deterministic mode also fills every new tensor with NaN (so a read of uninitialised memory
        # is reproducible): a fill kernel per allocation, ~2,100 per step of BERT base on a GPU
        # (benchmarks/bench_gpu.py --profile-steps), and the loop reads no uninitialised memory.
        torch.utils.deterministic.fill_uninitialized_memory = False
    model = build_model(cfg, family, tok, seed, device)
    if hooks.initial is not None:
        hooks.initial(model)  # e.g. a student's layers copied from its teacher (workbench.loop)
    apply_param_filter(model, hooks.trainable)  # frozen before the optimizer: it never holds them
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_factory(cfg.warmup_steps(), cfg.total_steps))
    return model, optimizer, scheduler


def _seed_and_resume(seed: int, d: Dist, resume_from: Path | None, model, optimizer, scheduler) -> tuple:
    """Seed the global RNGs (dropout etc. draw from them: one stream per (seed, rank), saved and
    restored) and restore a resumed run's state; (start_step, tokens_seen, elapsed_before, epoch,
    batch_index)."""
    torch.manual_seed(_mix_seed(seed, d.rank, 0xD0))
    np.random.seed(_mix_seed(seed, d.rank) % (2**32))
    random.seed(_mix_seed(seed, d.rank, 0x9))
    if resume_from is None:
        return 0, 0, 0.0, 0, 0
    m_state, o_state, state = load_trainer_state(resume_from)
    if state["world_size"] != d.world:
        raise CheckpointError(f"{resume_from}: saved with world size {state['world_size']}, resuming with {d.world}")
    model.load_state_dict(m_state)
    optimizer.load_state_dict(o_state)
    scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"][d.rank])
    return state["step"], state["tokens_seen"], state["elapsed"], state["epoch"], state["batch_index"]


def _freeze_unused(model, cfg: TrainConfig, family: FamilySpec) -> None:
    """Parameters the objective never trains (BERT's pooler and NSP head with objective.nsp: false)
    are frozen after the optimizer is built (its groups, and so resuming, stay the same): they
    would get no gradient anyway, and DDP must not wait for one."""
    for p in getattr(model, "unused_parameters", lambda objective: [])(objective_settings(cfg, family)):
        p.requires_grad_(False)


def _open_log(out: Path, d: Dist, keep_up_to: int):
    """The run's log.jsonl opened for appending on the main rank (None elsewhere): lines up to a
    resumed checkpoint (`keep_up_to`) stay, since each step is logged before its checkpoint is
    written; a fresh start (-1) starts a fresh log. Half-written checkpoints of a killed run go."""
    if not d.main:
        return None
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log.jsonl"
    _repair_log(log_path, keep_up_to)
    for stale in out.glob(f".{STEP_PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    return open(log_path, "a", encoding="utf-8")


def _global_terms(terms: dict, step_tokens: int, d: Dist) -> tuple[dict, int]:
    """The loss terms averaged over ranks and the step's tokens summed (one all-reduce)."""
    names = sorted(terms)
    vec = torch.stack([terms[k] for k in names] + [torch.tensor(float(step_tokens), dtype=torch.float64,
                                                               device=terms[names[0]].device)])
    dist.all_reduce(vec)
    return {k: vec[i] / d.world for i, k in enumerate(names)}, int(vec[-1])


def _train_seed(cfg: TrainConfig, seed: int, data: TrainingData | None, d: Dist | None, hooks: TrainingHooks) -> Path:
    # ---- setup: data, run folder, model, optimizer, RNG streams, resume
    family = get_family(cfg.family)
    check_seq_len_warmup(cfg, family)
    d = d or init_distributed(cfg.device)
    device = d.device(cfg.device)
    if cfg.batch_size % d.world:
        raise ConfigError(f"{cfg.source}: batch_size: {cfg.batch_size} is not divisible by the world size {d.world}")
    data = data or prepare_data(cfg, family, d)
    tok = data.tokenizer
    out = run_dir(cfg, seed)
    total = cfg.total_steps
    ckpts = checkpoint_steps(total, cfg.checkpoints.every, cfg.checkpoints.log_spaced)

    claim_run_folder(cfg, seed, out, d, hooks, device)
    existing = list_checkpoints(out)
    if existing and existing[-1][0] == total:
        return existing[-1][1]
    resume_from = next((p for s, p in reversed(existing) if (p / STATE_DIR / "state.pt").exists()), None)

    model, optimizer, scheduler = _build_trainable(cfg, family, tok, seed, device, hooks)
    collate = family.make_collator(objective_settings(cfg, family), tok)
    start_step, tokens_seen, elapsed_before, epoch, batch_index = _seed_and_resume(
        seed, d, resume_from, model, optimizer, scheduler)
    position = (epoch, batch_index)  # where the data stream stands after the last step
    _freeze_unused(model, cfg, family)
    manifest = checkpoint_manifest(cfg, family, data, seed, d, count_trainable(model, hooks.trainable), hooks, device)
    cost = pretraining_cost_meter(manifest, device, d, resume_from)
    prepare_teacher(hooks, device)
    train_model = model
    if d.world > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    train_model.train()
    log_file = _open_log(out, d, start_step if resume_from is not None else -1)
    t0 = time.perf_counter()
    tokens_at_start = tokens_seen

    # ---- evaluate (held-out loss of the family's own objective) and save
    def heldout_eval():
        if cfg.eval.batches <= 0:
            return None
        return evaluate_heldout(train_model, family, data.heldout, tok, cfg, cfg.eval.batches, device)

    def log(rec: dict) -> None:
        if d.main:
            log_file.write(json.dumps(rec) + "\n")
            log_file.flush()

    pending_record: dict | None = None  # the last step's record, its loss terms still tensors

    def write_pending_record() -> None:
        nonlocal pending_record
        if pending_record is None:
            return
        rec = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in pending_record.items()}
        pending_record = None
        log(rec)
        rate = (rec["tokens"] - tokens_at_start) / max(1e-9, time.perf_counter() - t0)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rate:,.0f}", refresh=False)

    if start_step == 0 and 0 in ckpts and not (resume_from is not None and resume_from == step_dir(out, 0)):
        heldout0 = heldout_eval()
        log({"step": 0, "tokens": 0, "lr": 0.0, "elapsed": 0.0, **{f"heldout_{k}": v for k, v in (heldout0 or {}).items()}})
        save_checkpoint(out, 0, train_model, optimizer, scheduler, position, 0, 0.0, {**manifest, "cost": cost(0, 0.0)},
                        tok, d, heldout0)

    # ---- the steps
    bar = progress(total=total, initial=start_step, desc=f"{cfg.name} seed {seed}", unit="step",
                   disable=not (cfg.progress and d.main), dynamic_ncols=True)
    make_batches = functools.partial(step_batches, family, data.train, cfg, seed, d, collate, tok, epoch, batch_index,
                                     start_step, total)
    try:
        with host_batches(make_batches, worker=device.type == "cuda") as batches:
            for step_batch in batches:
                step, seq_len, step_tokens = step_batch.step, step_batch.seq_len, step_batch.tokens
                terms: dict[str, torch.Tensor] = {}
                for micro, host_batch in enumerate(step_batch.micro):
                    batch = {k: v.to(device, non_blocking=True) for k, v in host_batch.items()}
                    last = micro == cfg.grad_accum - 1
                    sync = contextlib.nullcontext() if (last or d.world == 1) else train_model.no_sync()
                    with sync:
                        with _autocast(cfg, device):
                            micro_terms = loss_terms(train_model, batch, hooks, pretraining_loss)
                        (micro_terms["loss"] / cfg.grad_accum).backward()
                    for k, v in micro_terms.items():  # float64 on the device: the same sums as Python floats
                        terms[k] = terms.get(k, 0.0) + v.detach().double() / cfg.grad_accum
                lr = optimizer_step(model, optimizer, scheduler, cfg.clip, hooks, step + 1)

                if d.world > 1:  # log the global mean loss and the global token count
                    terms, step_tokens = _global_terms(terms, step_tokens, d)
                tokens_seen += step_tokens
                position = (step_batch.epoch, step_batch.batch_index)
                elapsed = elapsed_before + time.perf_counter() - t0
                done = step + 1
                heldout = heldout_eval() if done in ckpts else None
                # A step's record is written once the next step is queued: reading its loss waits for the
                # device, and on a GPU a wait every step would leave it idle while the host prepares the
                # next batch. Before a checkpoint the record is written at once (the log holds every
                # checkpointed step).
                write_pending_record()
                if done % cfg.log_every == 0 or heldout is not None or done == total:
                    pending_record = {"step": done, "tokens": tokens_seen, "lr": lr, **terms, "elapsed": round(elapsed, 3)}
                    if cfg.seq_len_warmup is not None:
                        pending_record["seq_len"] = seq_len
                    if heldout is not None:
                        pending_record.update({f"heldout_{k}": v for k, v in heldout.items()})
                if done in ckpts or done == total:
                    write_pending_record()
                if done in ckpts:
                    save_checkpoint(out, done, train_model, optimizer, scheduler, position, tokens_seen, elapsed,
                                    {**manifest, "cost": cost(tokens_seen, elapsed)}, tok, d, heldout)
                bar.update(1)
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()
    return step_dir(out, total)


def train_from_config(path_or_dict, overrides: dict | None = None, hooks: TrainingHooks | None = None,
                      executor=None) -> list[Path]:
    """Train every seed of a config (YAML path, dict or TrainConfig); the final checkpoint of each.

    By default the seeds run one after the other in this process and share the corpus, tokenizer and
    tokenised corpus; `hooks` as in `train_seed`. With `executor` (`ExecutorOptions` or its name:
    local processes, submitit, Slurm) each seed is a unit of the one executor (`train_units`): the
    data is prepared here first (its caches on disk), then every worker opens it and trains its seed
    (one torch thread each, no bars). Under torchrun the ranks share one seed at a time, so the
    executor is refused there, as are hooks (they run in this process only).
    """
    cfg = load_train_config(path_or_dict, overrides)
    options = None if executor is None else resolve_options(executor)
    return run_plan(train_units(cfg, hooks=hooks), options)


def train_units(cfg: TrainConfig, store=None, hooks: TrainingHooks | None = None) -> UnitPlan:
    """The driver's units (`DriverSpec.units`): the seeds. In this process they share the prepared
    data (`train_seed`); in workers each opens what the parent prepared (`train_seed_unit`), after
    the refusals of `train_from_config`, which come before any data is built."""
    family = get_family(cfg.family)
    check_seq_len_warmup(cfg, family)  # before the corpus is built

    def units(parallel: bool) -> list[Unit]:
        if parallel and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("--executor/--jobs spread seeds over processes; under torchrun the ranks already share each seed")
        if parallel and hooks is not None and hooks != NO_HOOKS:
            raise ConfigError("training hooks run in this process only: train with hooks without --executor/--jobs")
        d = init_distributed(cfg.device)
        data = prepare_data(cfg, family, d)
        if not parallel:
            return [Unit(train_seed, (cfg, seed, data, d, hooks), name=f"seed {seed}") for seed in cfg.seeds]
        worker_cfg = dataclasses.replace(cfg, progress=False)  # not in the run's identity: the same folders
        return [Unit(train_seed_unit, (worker_cfg, seed), name=f"seed {seed}") for seed in cfg.seeds]

    return UnitPlan(units, len(cfg.seeds), run_dir(cfg, 0).parent, desc="train seeds")


def train_seed_unit(cfg: TrainConfig, seed: int) -> Path:
    """One seed as an executor unit (a fresh process or a Slurm job): open the data the parent
    prepared (the corpus split, the tokenizer and the tokenised corpus are read from their caches)
    and train the seed, resuming its folder as a rerun would."""
    family = get_family(cfg.family)
    d = Dist()
    return train_seed(cfg, seed, prepare_data(cfg, family, d), d)


def read_log(run_folder: str | Path) -> list[dict]:
    """The JSONL loss log of one seed's run folder as a list of records."""
    path = Path(run_folder) / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the driver ---------------------------------------------------------------------------------


def load_driver_config(source, overrides: dict | None = None) -> TrainConfig:
    """The registry's load for `bertology train`: a config file (or mapping) with the flags' overrides,
    or, without one (`{}`), `--family F --preset P`: that family at the preset's measured recipe
    (`PRESET_RECIPES`; `--steps`/`--tokens` replace its steps; BERT's small recipe without NSP).
    `--precision` decides alone: an older `cpu_bf16: true` in the file yields to it."""
    overrides = dict(overrides or {})
    if overrides.get("precision") is not None:
        overrides["cpu_bf16"] = False
    if isinstance(source, dict) and not source and overrides.get("family") is not None:
        family, preset = overrides["family"], overrides.get("preset") or "small"
        source = {"family": family, "preset": preset, "name": f"{family}_{preset}"}
        recipe = dict(PRESET_RECIPES[preset])
        if overrides.get("steps") is not None or overrides.get("tokens") is not None:
            recipe.pop("steps")
        if preset == "small" and family == "bert":
            recipe["objective"] = {"nsp": False}
        source.update(recipe)
    return load_train_config(source, overrides)


def _run(cfg: TrainConfig, store=None, executor=None) -> list[Path]:
    return train_from_config(cfg, None, executor=executor)


def report(finals: list[Path]) -> str:
    """What `bertology train` prints: each seed's final checkpoint, one a line."""
    return "\n".join(str(path) for path in finals)


DRIVER = DriverSpec("train", TrainConfig, load_driver_config, _run, report, identity=TrainConfig.training_hash,
                    units=train_units, collect=lambda cfg, store, plan, results: results)


def train_cli_main(argv: list[str] | None = None) -> int:
    """`bertology train CONFIG.yaml [--set key=value ...]` or `bertology train --family F --preset P`
    (and `python -m workbench.drivers.train` under torchrun): the registry's command
    (`workbench.drivers.spec.DRIVERS["train"]`: --family, --preset, --steps, --tokens, --seeds S [S ...],
    --name, --output-dir, --device, --precision auto|fp32|bf16, --set KEY=VALUE by the one override
    rule, the executor's flags: seeds as units). Prints each seed's final checkpoint."""
    from workbench.drivers.spec import add_command_arguments, run_command

    p = argparse.ArgumentParser(prog="bertology train", description="Pretrain a model family (one loop for all).")
    add_command_arguments(p, "train")
    print(run_command("train", p.parse_args(argv)))
    return 0


if __name__ == "__main__":  # `torchrun --nproc_per_node 2 -m workbench.drivers.train CONFIG.yaml`
    from workbench.errors import cli_errors

    try:
        sys.exit(cli_errors(train_cli_main, "python -m workbench.drivers.train"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
