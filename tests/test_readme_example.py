"""The README's Theorem 1 example runs as printed (a convolution equals quadratic attention)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_theorem_1_example_runs():
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  code = re.findall(r"```python\n(.*?)```", readme, re.S)
  blocks = [block for block in code if "QuadraticPositional(" in block]
  assert len(blocks) == 1, "expected one README example building QuadraticPositional"
  exec(compile(blocks[0], "README.md", "exec"), {})  # its last line asserts conv == attention
