"""``benchmarks/accelerator.py --smoke``: the GPU kit's code, run on CPU at toy sizes."""

import importlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _image_folder(root: Path) -> Path:
  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    for label in ("cat", "dog"):
      (root / split / label).mkdir(parents=True)
      for i in range(4):
        pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / split / label / f"{i}.jpg")
  return root


def test_smoke_run_prints_the_three_tables_and_the_profile(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "CIFAR10_ROOT")}
  result = subprocess.run(
    [
      sys.executable,
      "benchmarks/accelerator.py",
      "--smoke",
      "--augment_on=device",
      "--variants=default,cudnn,k4,flat_opt",
      "--profile=2",
      "--compile_threads=2",  # the GPU script's path: every row compiled first, in threads
      f"--data_root={_image_folder(tmp_path)}",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,  # about 60 s of CPU time; a shared machine at load 20 took 140 s before
  )
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "H100 PCIe" in out and "TPU v5 lite" in out  # the peak table
  assert "device: cpu" in out and "MFU not computed" in out
  # Table 1: ConViT-Ti, then timm's sides (here the PyTorch reference, timm's names), eager and
  # through torch.compile, each with its step time against locvit's.
  number = r" +([\d.]+)"
  lines = {}
  for side in ("locvit default", "timm eager", "timm compile"):
    line = re.search(rf"^convit_tiny +32 +2 {side}{number * 3} +n/a{number}x +(\S+)", out, re.M)
    assert line, out
    lines[side] = [float(x) if x != "-" else None for x in line.groups()]
  gflops, step_ms, images_per_s, ratio, _ = lines["locvit default"]
  assert gflops > 0 and step_ms > 0 and ratio == 1.0
  np.testing.assert_allclose(images_per_s, 2e3 / step_ms, rtol=0.01)
  for side in ("timm eager", "timm compile"):
    torch_gflops, torch_ms, _, torch_ratio, compile_s = lines[side]
    assert torch_gflops == gflops
    np.testing.assert_allclose(torch_ratio, torch_ms / step_ms, rtol=0.02, atol=0.01)
    assert (compile_s is not None) == (side == "timm compile")
  assert "torch.compile(backend='aot_eager') on cpu" in out
  assert re.search(
    r"^convit_tiny +32 +2 locvit cudnn: skipped, cuDNN attention needs a CUDA", out, re.M
  )
  assert re.search(r"^GMM-ViT d9 +32 +2 locvit default .* 1\.00x", out, re.M), out
  # Four steps per dispatch (config.steps_per_dispatch): its step time is per optimizer step.
  k4 = re.search(rf"^GMM-ViT d9 +32 +2 locvit k4{number * 3} +n/a{number}x", out, re.M)
  assert k4 and float(k4[1]) > 0, out
  np.testing.assert_allclose(float(k4[3]), 2e3 / float(k4[2]), rtol=0.01)
  # The optimizer on one flat vector (optimizer.flatten).
  assert re.search(rf"^GMM-ViT d9 +32 +2 locvit flat_opt{number * 3} +n/a{number}x", out, re.M)
  # Table 1p: a profile of two calls of each locvit side, XLA:CPU's thunks as the device ops.
  for row in ("convit_tiny b2 default", "GMM-ViT d9 b2 default", "GMM-ViT d9 b2 k4"):
    line = re.search(rf"^{row} +cpu{number * 3} +(\d+)%{number * 3} +(\d+)(\+\d+)?$", out, re.M)
    assert line, out
    ops, wall, busy, busy_share, gaps, _, dispatch = map(float, line.groups()[:7])
    # The kernels the compiled step lists (+ in its loops' bodies: K steps a call run in one).
    listed = int(line[9][1:]) if row.endswith("k4") else int(line[8])
    assert listed > 100
    assert ops > 100 and 0 < busy <= wall and gaps < wall and dispatch > 0
    assert abs(busy_share - 100 * busy / wall) <= 1
    top = out[line.end() :].splitlines()[1:6]  # the five costliest ops
    assert all(re.match(r"^ +[\d.]+ ms +\d+% x\d+ +\S", x) for x in top), top
  # benchmarks/kit_compare.py reads both tables (kit_gpu.sh's before-and-after of call A0 and A).
  compare = _benchmarks_module("kit_compare")
  sides = compare.read_log(out)
  assert sides[("convit_tiny", 2, "default")]["ms"] == step_ms, sides
  rows = ("convit_tiny", "GMM-ViT d9")
  assert set(sides) == {(row, 2, side) for row in rows for side in ("default", "k4", "flat_opt")}
  assert sides[("GMM-ViT d9", 2, "k4")]["kernels"] == ops  # the last row of Table 1p read above
  assert re.search(r"^GMM-ViT d9 b2 +k4 .* 1\.00x ", "\n".join(compare.comparison(out, out)), re.M)
  # Table 2: three steps from the image folder.
  assert "8 training images read and decoded in" in out
  row = re.search(
    r"^GMM-ViT d6 \(GMM masks\) +crop_flip \+ autoaug-cifar10 +device +4"
    r" +([\d.]+) +(\d+)% +(\d+)%$",
    out,
    re.M,
  )
  assert row, out
  assert float(row[1]) > 0 and 0 <= int(row[2]) <= 100 and 0 <= int(row[3]) <= 100
  # Table 3: DeiT's recipe from JPEGs, the crop's resize on the device.
  assert "Table 3: DeiT-Ti, the DeiT recipe at 32 from 8 JPEGs" in out
  for host in ("threads", "procs"):
    row = re.search(rf"^\d+ {host} +device +2 +([\d.]+) +(\d+)% +(\d+)%$", out, re.M)
    assert row and float(row[1]) > 0, out


def test_seeds_side_by_side_smoke_prints_n_lone_steps_beside_one_n_seed_step():
  """benchmarks/seeds_side_by_side.py --smoke (issue 43): per N, the lone side's kernels are N
  times the lone step's, and the N-seed step dispatches fewer kernels than its N lone steps."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  command = ["benchmarks/seeds_side_by_side.py", "--smoke", "--recipes=GMM-ViT d9", "--seeds=1,2"]
  result = subprocess.run(
    [sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
  )
  assert result.returncode == 0, result.stderr[-3000:]
  number = r" +([\d.]+)"
  rows = {}
  for n in (1, 2):
    for side in ("lone", "side by side"):
      line = re.search(
        rf"^GMM-ViT d9 +2 +{n}  {side}{number * 3}{number}x +(\d+){number}x +(\S+)$",
        result.stdout,
        re.M,
      )
      assert line, result.stdout
      rows[n, side] = line.groups()
  for (n, _side), (ms, per_seed, everyone, speedup, kernels, per_lone, _) in rows.items():
    assert float(ms) > 0
    np.testing.assert_allclose(float(per_seed), 2e3 / float(ms), rtol=0.01)
    np.testing.assert_allclose(float(everyone), n * float(per_seed), rtol=0.01)
    lone_ms, lone_kernels = float(rows[n, "lone"][0]), int(rows[n, "lone"][4])
    np.testing.assert_allclose(float(speedup), lone_ms / float(ms), rtol=0.01, atol=0.01)
    np.testing.assert_allclose(float(per_lone), int(kernels) / lone_kernels, atol=0.01)
  assert int(rows[2, "lone"][4]) == 2 * int(rows[1, "lone"][4])
  assert int(rows[2, "side by side"][4]) < int(rows[2, "lone"][4])
  assert rows[1, "lone"][6] == "-" and float(rows[2, "side by side"][6]) > float(
    rows[1, "side by side"][6]
  )  # XLA's memory of the N-seed step: two states held


def test_seeds_side_by_side_gpu_counts_kernels_and_times_nothing():
  """``--gpu`` compiles the steps for a GPU that is not there: timing flags are refused with the
  reason, before anything compiles."""
  command = ["benchmarks/seeds_side_by_side.py", "--gpu=h200", "--rounds=3"]
  result = subprocess.run(
    [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 2
  assert result.stderr.endswith(
    "seeds_side_by_side.py: error: --steps, --rounds and --warmup time the steps: --gpu compiles "
    "them, no more\n"
  )


def _benchmarks_module(name: str):
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    return importlib.import_module(name)
  finally:
    sys.path.pop(0)


# Two GPU streams and CUPTI's own line, as the profiler records them (times in ps from the line).
GPU_TRACE = """
planes {
  name: "/device:GPU:0"
  lines { name: "Stream #7(Kernel)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 4000000 }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 1000000 }
    events { metadata_id: 1 offset_ps: 10000000 duration_ps: 4000000 }
  }
  lines { name: "Stream #9(MemcpyD2H)" timestamp_ns: 1000
    events { metadata_id: 3 offset_ps: 3000000 duration_ps: 2000000 }
  }
  lines { name: "CUPTI overhead" timestamp_ns: 1000
    events { metadata_id: 2 offset_ps: 0 duration_ps: 90000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "gemm" } }
  event_metadata { key: 2 value { id: 2 name: "loop_fusion" } }
  event_metadata { key: 3 value { id: 3 name: "MemcpyD2H" } }
}
planes {
  name: "/host:CPU"
  lines { name: "python" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 300000 }
    events { metadata_id: 1 offset_ps: 500000 duration_ps: 500000 }
  }
  event_metadata { key: 1 value { id: 1 name: "locvit-kit-dispatch" } }
}
"""


def test_profile_summary_of_a_gpu_trace():
  import jax

  step_profile = _benchmarks_module("step_profile")
  profile = jax.profiler.ProfileData.from_text_proto(GPU_TRACE)
  summary = step_profile.summarise(profile, steps=2, wall_s=20e-6)
  # Ops at [1, 5] (gemm), [4, 6] (copy), [7, 8] (fusion), [11, 15] (gemm) us: busy 5 + 1 + 4 us
  # of the 14 us span, gaps of 1 and 3 us.
  assert summary.platform == "gpu" and summary.ops_per_step == 2.0
  assert (summary.wall_ms, summary.busy_ms, summary.between_ops_ms) == (0.01, 0.005, 0.002)
  assert summary.median_gap_us == 2.0 and summary.dispatch_ms == 0.0004
  assert summary.top == (
    ("gemm", 1.0, 0.004),
    ("MemcpyD2H", 0.5, 0.001),
    ("loop_fusion", 0.5, 0.0005),
  )
  # The gaps, longest first, with the ops on either side; none over 10 us; one copy to the host.
  assert summary.longest_gaps == ((3.0, "loop_fusion", "gemm"), (1.0, "MemcpyD2H", "loop_fusion"))
  assert (summary.long_gaps_per_step, summary.long_gaps_ms) == (0.0, 0.0)
  assert summary.device_to_host_per_step == 0.5


def test_the_beta_loops_side_draws_lam_with_jax_random_beta_and_the_default_without_a_loop():
  from locvit.configs.common import complete_config
  from locvit.run.step import initial_health

  kit = _benchmarks_module("kit")

  def lowered_for_a_gpu(variant):
    config = complete_config(kit.config_32("GMM-ViT d9", 2, True))
    state, step = kit.state_and_step(config, (32, 32, 3), 10, loop=True)
    batches = [kit.synthetic_batch(2, 32, 10)]
    with kit.tracing(variant):
      traced = step.trace(state, batches, (), initial_health())
    return traced.lower(lowering_platforms=("cuda",)).as_text()

  assert "stablehlo.while" in lowered_for_a_gpu("beta_loops")
  assert "stablehlo.while" not in lowered_for_a_gpu("default")  # and the patch is undone


def test_the_bias_add_side_keeps_the_biases_out_of_the_gpu_steps_matmuls():
  """The step compiled for XLA:GPU (a compile-only device's platform) puts a ones column into
  each dense layer's matmul (``ops.bias_in_matmul``); the 'bias_add' side does not."""
  from locvit.configs.common import complete_config
  from locvit.run.step import initial_health

  kit = _benchmarks_module("kit")
  config = complete_config(kit.config_32("ViT d9", 2, True))
  config.attention_implementation = "xla"  # what None is on a GPU (this host resolves the CPU's)
  batches = [kit.synthetic_batch(2, 32, 10)]

  def concatenations(variant):  # a step per side, as compile_loop_step builds (jit caches traces)
    state, step = kit.state_and_step(config, (32, 32, 3), 10, loop=True, platform="gpu")
    with kit.tracing(variant):
      jaxpr = jax.make_jaxpr(step)(state, batches, (), initial_health())
    return str(jaxpr).count("concatenate")

  # Two blocks of proj, fc1 and fc2, forward (their transposes slice; qkv has no bias here).
  assert concatenations("default") - concatenations("bias_add") == 2 * 3
  assert concatenations("default") - concatenations("bias_add") == 2 * 3  # the patch is undone


@pytest.mark.parametrize("setting", ["gpu_tuned", "gpu_graphs"])
def test_gpu_compiler_options_are_valid_xla_options(setting):
  import jax
  import jax.numpy as jnp

  from locvit.platform import xla_options

  assert xla_options.resolve("auto", "gpu") == "gpu_tuned"
  assert xla_options.compiler_options("auto", "cpu") == {}
  options = xla_options.compiler_options(setting, "gpu")
  # This jaxlib refuses an unknown option or value when compiling, for any backend.
  lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(2))
  assert lowered.compile(options)(jnp.ones(2)).tolist() == [2.0, 2.0]
  # ...and as the train step takes them (train.make_step_fn).
  assert jax.jit(lambda x: x * 3, compiler_options=options)(jnp.ones(2)).tolist() == [3.0, 3.0]
  with pytest.raises(Exception, match="'BOGUS' is not a valid enum value"):
    lowered.compile({**options, "xla_gpu_enable_command_buffer": "FUSION,BOGUS"})
  choices = r"\['auto', 'none', 'gpu_tuned', 'gpu_graphs'\]"
  with pytest.raises(ValueError, match=rf"^xla_options='fast' is not one of {choices}$"):
    xla_options.resolve("fast", "gpu")


def _wheel(folder: Path, name: str, requires: list[str]) -> Path:
  path = folder / f"{name}-1.0-py3-none-any.whl"
  metadata = "".join(f"Requires-Dist: {r}\n" for r in requires)
  with zipfile.ZipFile(path, "w") as archive:
    archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\n{metadata}")
  return path


def test_gpu_wheels_names_a_requirement_nothing_provides(tmp_path):
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    import gpu_wheels
  finally:
    sys.path.pop(0)
  wheels = [
    _wheel(tmp_path, "grain", ["absl-py", "array-record>=0.8.1; sys_platform != 'win32'"]),
    _wheel(tmp_path, "array_record", ["etils[epath]", "Tree_Lib (>=1)", "pytest; extra == 'test'"]),
  ]
  assert gpu_wheels.missing(wheels) == {"array_record-1.0-py3-none-any.whl": ["tree-lib"]}
  assert gpu_wheels.missing(wheels[:1]) == {"grain-1.0-py3-none-any.whl": ["array-record"]}


def test_step_hlo_diff_ignores_names_and_locations_only():
  sys.path.insert(0, str(ROOT / "benchmarks"))
  try:
    import step_hlo_diff
  finally:
    sys.path.pop(0)
  a = """HloModule jit_step, entry_computation_layout={(f32[2]{0})->f32[2]{0}}
ENTRY %main.12 (p.1: f32[2]) -> f32[2] {
  %p.1 = f32[2]{0} parameter(0), metadata={op_name="x" source_file="/a/locvit/x.py"}
  ROOT %add.7 = f32[2]{0} add(%p.1, %p.1), metadata={source_line=3}, stack_frame_id=4
}
FileNames
1 "/a/locvit/x.py"
StackFrames
4 {file_location_id=1 parent_frame_id=0}"""
  renamed = a.replace("%add.7", "%add.9").replace("/a/", "/b/").replace("line=3", "line=5")
  assert step_hlo_diff.normalised(a) == step_hlo_diff.normalised(renamed)
  other_op = a.replace("add(", "multiply(")
  assert step_hlo_diff.normalised(a) != step_hlo_diff.normalised(other_op)


def test_a_cudnn_side_cudnn_cannot_train_is_skipped_with_locvits_reason():
  """On a GPU the kit skips such a side with this line instead of compiling it (the H200 run got
  JAX's NotImplementedError traceback for ViT d9's 65 tokens, which locvit now pads to 66); the
  check itself runs anywhere."""
  kit, accelerator = _benchmarks_module("kit"), _benchmarks_module("accelerator")
  vit = kit.config_32("ViT d9", 128, smoke=False)  # class token: 64 patches + 1
  assert accelerator.cudnn_refusal(vit, 32, 10) is None
  vit.mixed_precision = False
  assert accelerator.cudnn_refusal(vit, 32, 10) == (
    "attention_implementation='cudnn': cuDNN's fused attention cannot take float32 inputs (it "
    "needs bfloat16 or float16: mixed precision); use attention_implementation='xla' or None "
    "(JAX's choice: XLA)"
  )
  assert accelerator.cudnn_refusal(kit.config_32("GMM-ViT d9", 128, smoke=False), 32, 10) is None


def test_step_kernels_counts_entry_kernels_by_the_part_of_the_step_they_came_from():
  kit = _benchmarks_module("kit")  # the HLO parsing benchmarks/step_kernels.py prints
  step_py = ROOT / "locvit" / "run" / "step.py"
  lines = step_py.read_text().splitlines()
  update = next(i + 1 for i, line in enumerate(lines) if "tx.update(" in line)
  # XLA prints a frame's parent as its id + 1: frame 2's parent is frame 1, a root's "parent" 1.
  hlo = f"""HloModule jit_step
ENTRY %main.9 (p.1: f32[2]) -> (f32[2]) {{
  %p.1 = f32[2]{{0}} parameter(0)
  %constant.2 = f32[] constant(1)
  %bitcast.3 = f32[2]{{0}} bitcast(%p.1)
  %fusion.4 = f32[2]{{0}} fusion(%p.1), calls=%f, metadata={{op_name="jit(s)/jvp(ViT)/mul"}}
  %mul_fusion.5 = f32[2]{{0}} fusion(%p.1), metadata={{op_name="transpose(jvp(ViT))/mul" \
stack_frame_id=2}}
  %add_fusion.6 = f32[2]{{0}} fusion(%p.1), calls=%g, metadata={{op_name="add" stack_frame_id=4}}
  %copy.7 = f32[2]{{0}} copy(%p.1)
  ROOT %tuple.8 = (f32[2]{{0}}) tuple(%add_fusion.6)
}}

FileNames
1 "{step_py}"
2 "/site-packages/optax/_src/transform.py"
FunctionNames
1 "train_step"
2 "loss_and_metrics"
3 "scale_by_adam.<locals>.update_fn"
FileLocations
1 {{file_name_id=1 function_name_id=1 line={update} end_line={update} column=1 end_column=2}}
2 {{file_name_id=1 function_name_id=2 line=46 end_line=46 column=1 end_column=2}}
3 {{file_name_id=2 function_name_id=3 line=284 end_line=284 column=1 end_column=2}}
4 {{file_name_id=1 function_name_id=1 line=1 end_line=1 column=1 end_column=2}}
StackFrames
1 {{file_location_id=4 parent_frame_id=1}}
2 {{file_location_id=2 parent_frame_id=2}}
3 {{file_location_id=1 parent_frame_id=1}}
4 {{file_location_id=3 parent_frame_id=4}}
"""
  counts = kit.kernel_counts(hlo)
  assert {k: n for k, n in counts.items() if isinstance(k, str)} == {
    "model forward": 1,  # no stack: its op_name
    "model backward": 1,
    "optimizer update": 1,  # optax's frame, under train_step's tx.update line
    "no source (XLA's own)": 1,
  }
  assert counts[("opcode", "fusion")] == 3 and counts[("opcode", "copy")] == 1
  # What each kernel reads and writes, once: its f32[2] operand and result, 8 bytes each.
  assert counts[("bytes", "model forward")] == 16 and kit.array_bytes("(bf16[3,4], pred[5])") == 29


def test_step_kernels_counts_kernels_inside_command_buffers_and_loop_bodies_apart():
  kit = _benchmarks_module("kit")
  # XLA:GPU's command buffer is a `call`: its kernels run where it is; a while's body runs per
  # iteration, so its kernels are counted apart from the step's.
  hlo = """HloModule jit_step
%command_buffer (p.0: f32[2]) -> f32[2] {
  %p.0 = f32[2]{0} parameter(0)
  %fusion.1 = f32[2]{0} fusion(%p.0), kind=kLoop, metadata={op_name="jit(s)/jvp(ViT)/mul"}
  ROOT %fusion.2 = f32[2]{0} fusion(%fusion.1), kind=kLoop, metadata={op_name="jit(s)/jvp(ViT)/add"}
}

%body (t.0: (s32[], f32[2])) -> (s32[], f32[2]) {
  %t.0 = (s32[], f32[2]{0}) parameter(0)
  %gte.1 = f32[2]{0} get-tuple-element(%t.0), index=1
  %fusion.3 = f32[2]{0} fusion(%gte.1), kind=kLoop
  %fusion.4 = s32[] fusion(%t.0), kind=kLoop
  ROOT %tuple.5 = (s32[], f32[2]{0}) tuple(%fusion.4, %fusion.3)
}

%cond (t.1: (s32[], f32[2])) -> pred[] {
  %t.1 = (s32[], f32[2]{0}) parameter(0)
  ROOT %fusion.6 = pred[] fusion(%t.1), kind=kLoop
}

ENTRY %main (p.1: f32[2]) -> f32[2] {
  %p.1 = f32[2]{0} parameter(0)
  %call.7 = f32[2]{0} call(%p.1), to_apply=%command_buffer
  %tuple.8 = (s32[], f32[2]{0}) tuple(%p.1, %call.7)
  %while.9 = (s32[], f32[2]{0}) while(%tuple.8), condition=%cond, body=%body
  ROOT %gte.10 = f32[2]{0} get-tuple-element(%while.9), index=1
}
"""
  counts = kit.kernel_counts(hlo)
  assert {k: n for k, n in counts.items() if isinstance(k, str)} == {
    "model forward": 2,  # the command buffer's two fusions
    "no source (XLA's own)": 1,  # the while
    kit.LOOP_BODIES: 3,  # its body's two fusions and its condition's one
  }
  assert counts[("opcode", "fusion")] == 2 and counts[("opcode", "while")] == 1
  assert ("opcode", "call") not in counts
