"""One build step on top of pyproject.toml: ship ``mlx_spec_hook.pth``.

The ``.pth`` file must sit at the root of site-packages, where no package
file goes, so ``build_py`` writes it there: into the wheel's root for
``pip install .``, and into the editable wheel for ``pip install -e .``
(PEP 660; setuptools points the ``install`` command at that wheel's
directory). Its one line comes from :mod:`mlx_spec_hook`.
"""

import os
import runpy

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_pth(build_py):
    """``build_py`` that also writes the hook's ``.pth`` file."""

    def run(self):
        super().run()
        hook = runpy.run_path(os.path.join(HERE, "mlx_spec_hook.py"))
        if self.editable_mode:
            root = self.get_finalized_command("install").install_lib
        else:
            root = self.build_lib
        path = os.path.join(root, hook["PTH_NAME"])
        os.makedirs(root, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(hook["PTH_LINE"])
        self._pth_outputs = [path]

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + getattr(self, "_pth_outputs", [])


setup(cmdclass={"build_py": build_py_with_pth})
