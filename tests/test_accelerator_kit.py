"""``benchmarks/accelerator.py --smoke``: the GPU kit's code, run on CPU at toy sizes."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
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


def test_smoke_run_prints_the_three_tables(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "CIFAR10_ROOT")}
  result = subprocess.run(
    [
      sys.executable,
      "benchmarks/accelerator.py",
      "--smoke",
      "--augment_on=device",
      f"--data_root={_image_folder(tmp_path)}",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,  # about 50 s of CPU time; a shared machine at load 20 took 140 s
  )
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "H100 PCIe" in out and "TPU v5 lite" in out  # the peak table
  assert "device: cpu" in out and "MFU not computed" in out
  # Table 1: ConViT-Ti beside the PyTorch reference (timm's names), with a ratio.
  convit = re.search(
    r"^convit_tiny +32 +2 +([\d.]+) +([\d.]+) +([\d.]+) +n/a +([\d.]+) +([\d.]+)x", out, re.M
  )
  assert convit, out
  gflops, step_ms, images_per_s, torch_images_per_s, ratio = map(float, convit.groups())
  assert gflops > 0 and step_ms > 0 and torch_images_per_s > 0
  np.testing.assert_allclose(images_per_s, 2e3 / step_ms, rtol=0.01)
  # The table prints torch's img/s to 0.1, which on a loaded machine (about 1 img/s) is the
  # ratio's largest rounding error.
  slowest, fastest = torch_images_per_s + 0.05, max(torch_images_per_s - 0.05, 1e-3)
  assert images_per_s / slowest * 0.99 <= ratio <= images_per_s / fastest * 1.01
  assert re.search(r"^GMM-ViT \(GMM masks\) +32 +4 .* no timm model$", out, re.M), out
  # Table 2: three steps from the image folder.
  assert "8 training images read and decoded in" in out
  row = re.search(
    r"^GMM-ViT \(GMM masks\) +crop_flip \+ autoaug-cifar10 +device +4 +([\d.]+) +(\d+)% +(\d+)%$",
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
