"""Exact top-1 / top-5 evaluation over a whole split, at any batch size and device count: the
evaluation pass, the EMA weights' evaluation beside the model's, and eval-only mode
(``evaluate_checkpoint``, ``--mode=eval``).

The eval pipeline pads the last batches and marks real examples with ``mask``; the step sums
correct predictions over masked examples only, so no example is dropped or counted twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from locvit import metrics as metrics_lib
from locvit.data import device_augment
from locvit.platform import sharding
from locvit.run import bundle, predict, seeds
from locvit.run.preemption import EvaluationInterruptedError
from locvit.run.state import ema_enabled
from locvit.workdir import fingerprint, restore


def eval_step(
  model: nn.Module,
  variables: Any,
  batch: dict[str, jax.Array],
  prepare: Callable[[jax.Array], jax.Array] | None = None,
) -> dict[str, jax.Array]:
  """Sums of correct top-1 / top-5, loss and example count over the real (masked) examples.

  ``variables`` is ``(params, model_state)``; model_state holds e.g. BatchNorm statistics.
  ``prepare`` maps the batch's images to the model's input (the training loop passes the uint8
  normalisation, ``device_augment.normalize``).
  """
  params, model_state = variables
  images = batch["image"] if prepare is None else prepare(batch["image"])
  logits = model.apply({"params": params, **model_state}, images, train=False)
  labels, mask = batch["label"], batch["mask"].astype(jnp.float32)
  top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {
    "top1": jnp.sum((top5[:, 0] == labels) * mask),
    "top5": jnp.sum(jnp.any(top5 == labels[:, None], axis=-1) * mask),
    "loss": jnp.sum(loss * mask),
    "count": jnp.sum(mask),
  }


def make_eval_step(
  model, mesh, rules, variable_shardings, prepare=None, over_seeds: bool = False
) -> Callable:
  """Jitted ``eval_step``; ``variable_shardings`` matches ``(params, model_state)``; ``prepare``
  as in ``eval_step``. ``over_seeds``: the step of seeds side by side (``locvit.run.seeds``),
  ``eval_step`` vmapped over variables stacked on a leading seed axis (each seed laid out as
  ``variable_shardings``), the batch shared: each batch is read once for all seeds, and each sum
  carries the seed axis."""
  batch_sh = sharding.batch_sharding(mesh, rules)
  step = functools.partial(eval_step, model, prepare=prepare)
  if over_seeds:
    step = jax.vmap(step, in_axes=(0, None))
    variable_shardings = seeds.stacked_shardings(variable_shardings)
  return jax.jit(
    step, in_shardings=(variable_shardings, batch_sh), out_shardings=sharding.replicated(mesh)
  )


def evaluate(
  step_fn: Callable,
  variables: Any,
  batches: Iterable[dict[str, np.ndarray]],
  batch_sharding,
  on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
  """Runs ``step_fn`` over all batches; returns ``eval/top1``, ``eval/top5`` (fractions) etc.
  ``on_batch(batches_done)`` is called after each batch (progress lines). With the step of seeds
  side by side (``make_eval_step(over_seeds=True)``) each value is a list, one entry per seed
  (``seeds.split_metrics``)."""
  totals = None
  for done, local in enumerate(batches, 1):
    out = step_fn(variables, sharding.global_batch(local, batch_sharding))
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    if on_batch is not None:
      on_batch(done)
  if totals is None:
    raise ValueError("The evaluation split is empty.")
  totals = {key: np.asarray(value, np.float64) for key, value in jax.device_get(totals).items()}
  count = totals["count"]
  metrics = {
    "eval/top1": totals["top1"] / count,
    "eval/top5": totals["top5"] / count,
    "eval/loss": totals["loss"] / count,
    "eval/num_examples": np.rint(count).astype(np.int64),
  }
  return {key: value.tolist() for key, value in metrics.items()}


def evaluate_with_ema(
  eval_fn,
  variables,
  ema_params,
  batches,
  batch_sharding,
  print_line: Callable[[str], None],
  interrupted: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
  """``eval/*`` of ``variables`` (params, model_state); with EMA weights also ``eval_ema/*`` (timm
  evaluates both the model and its EMA). A long evaluation prints its progress with
  ``print_line``; it raises ``EvaluationInterruptedError`` after the batch during which
  ``interrupted()`` became True."""

  def on_batch():
    show = metrics_lib.eval_progress(len(batches), print_line)

    def call(done: int) -> None:
      show(done)
      if interrupted():
        raise EvaluationInterruptedError(
          f"the evaluation stopped after batch {done}/{len(batches)}"
        )

    return call

  result = evaluate(eval_fn, variables, batches, batch_sharding, on_batch())
  if ema_params is not None:
    ema_metrics = evaluate(eval_fn, (ema_params, variables[1]), batches, batch_sharding, on_batch())
    result.update({k.replace("eval/", "eval_ema/"): v for k, v in ema_metrics.items()})
  return result


def evaluate_checkpoint(
  config: ml_collections.ConfigDict,
  workdir: str,
  step: int | None = None,
  print_progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
  """Eval-only mode: restores parameters from ``workdir`` (latest or ``step``) and evaluates;
  ``print_progress`` gets a line every 10 s of a long evaluation.

  With ``config.ema.decay > 0`` the EMA weights are evaluated too (``eval_ema/*``). The config
  is checked first (``bundle.build_evaluation``), as a training run's is: nothing is read from
  ``workdir`` for a config with a bad value.
  """
  run = bundle.build_evaluation(config)
  config = run.config  # completed with the defaults
  # A checkpoint this config cannot read is refused before the model is traced (and warns).
  step = restore.vetted_step(
    workdir, step, lambda meta: fingerprint.check_compatible(meta["config"], config, workdir)
  )
  boxed_params, _ = sharding.model_variable_shapes(run.model, run.image_shape)
  variable_shardings = _variable_shardings(run)
  params, model_state = restore.read_model_variables(
    workdir, run.model, run.image_shape, step, variable_shardings
  )
  ema = None
  if ema_enabled(config):
    ema = restore.restore_ema_params(workdir, step, variable_shardings[0], boxed_params)
  result = _evaluate_variables(run, variable_shardings, (params, model_state), ema, print_progress)
  result["step"] = step
  return result


def _variable_shardings(run: bundle.Evaluation) -> tuple[Any, Any]:
  boxed_params, boxed_model_state = sharding.model_variable_shapes(run.model, run.image_shape)
  return (
    sharding.tree_shardings(boxed_params, run.mesh, run.rules),
    sharding.tree_shardings(boxed_model_state, run.mesh, run.rules),
  )


def _evaluate_variables(run, variable_shardings, variables, ema, print_progress) -> dict[str, Any]:
  config, mesh, rules = run.config, run.mesh, run.rules
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    normalize = functools.partial(device_augment.normalize, data_config=config.data)
    eval_fn = make_eval_step(run.model, mesh, rules, variable_shardings, normalize)
    return evaluate_with_ema(
      eval_fn, variables, ema, run.eval_batches, run.batch_sharding, print_progress
    )


def evaluate_weights(
  config: ml_collections.ConfigDict, print_progress: Callable[[str], None] = lambda line: None
) -> dict[str, Any]:
  """Eval-only mode on published weights (``config.init_from.weights``), no training run: their
  model and class count, the evaluation split read with their preprocessing
  (``locvit.run.predict.with_weights``). The result carries ``step`` 0 and the ``config`` run.

  ``build_evaluation`` checks the config (``checks.check_config``) with the weights' model and
  preprocessing in it: ``config.model.name`` may be any name ``load_pretrained`` reads (timm's
  ``*_distilled_*`` too), and it is the weights' registered model that is built."""
  pretrained = predict.load_weights(config, seed=config.seed)
  for note in pretrained.notes:
    print_progress(f"note: {note}")
  run = bundle.build_evaluation(predict.with_weights(config, pretrained))
  variable_shardings = _variable_shardings(run)
  params = jax.device_put(pretrained.variables["params"], variable_shardings[0])
  result = _evaluate_variables(run, variable_shardings, (params, {}), None, print_progress)
  return {**result, "step": 0, "config": run.config}
